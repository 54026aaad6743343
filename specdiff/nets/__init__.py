"""Networks and their checkpoint formats:

    dit.py               DDiT, the diffusion drafter's denoiser (MDLM / SEDD backbone)
    parameterization.py  raw network output -> x0 logits (subs, sedd)
    checkpoint.py        the project's drafter directory: config.json, safetensors, shared rows
    formats.py           reading MDLM / SEDD checkpoints as published
    a2d.py               dllm's masked-diffusion Qwen3 (A2D) checkpoints, checked, in transformers' Qwen3
    sdar.py              the SDAR block-diffusion LM's config, checked, in transformers' Qwen3
    dflash.py            the DFlash draft network (target-conditioned, Qwen3 layers) and its
                         published checkpoint format, read strictly
    eagle3.py            the EAGLE-3 draft head (one Llama layer over three fused target hidden
                         states, its own draft vocabulary) and its published format, read strictly

May import: torch, transformers, safetensors and specdiff.errors; nothing that decodes.
"""
