"""Drafters and the proposers that draft with them (contracts.Proposer):

    diffusion.py       DiffusionDrafter (a DDiT denoiser) and DiffusionProposer (T denoising steps
                       under a schedule: l2r, oneshot, confidence)
    autoregressive.py  ARDrafter (a small causal LM) and ARProposer (gamma sequential draws)
"""
