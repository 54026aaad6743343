"""Drafters and the proposers that draft with them (contracts.Proposer):

    diffusion.py       DiffusionDrafter (a DDiT denoiser), x0_logits_from (the one chain from ids to
                       x0 logits: drafting, exported graphs and training) and DiffusionProposer (T
                       denoising steps under a schedule: l2r, oneshot, confidence)
    a2d.py             A2DDrafter: dllm's masked-diffusion Qwen3 (nets/a2d.py) behind DiffusionDrafter's
                       drafting interface, so DiffusionProposer drafts with it
    autoregressive.py  ARDrafter (a small causal LM) and ARProposer (gamma sequential draws)
    dflash.py          DFlashDrafter: a block drafted in one pass from the target's hidden states,
                       with the target's embedding and head (nets/dflash.py); the method that
                       drives it per verify round is not here
    eagle3.py          Eagle3Drafter: an EAGLE-3 head (nets/eagle3.py) drafting a chain step by step
                       from the target's fused hidden states, with its own KV cache and draft vocabulary

May import: contracts, sampling, vocab, nets, targets, errors; not the decoding loops, methods or generation.
"""
