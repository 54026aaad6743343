"""Kinds of target, each over its own KV cache:

    causal.py  CausalLMTarget: a Hugging Face causal LM (contracts.Target), per-row cache (rows.py)
    rows.py    RowCache: per-row lengths, join / extend / rollback / keep over B rows of KV tensors
    trees.py   TreeRows: a RowCache that verifies draft trees (extend_tree, keep_path)
    static.py  StaticTarget: a causal LM over a static cache with compiled steps (--compile)
    block.py   BlockDiffusionTarget: a block-diffusion LM in SDAR layout (contracts.BlockTarget)

May import: contracts, errors, hf_cache, nets and transformers; not the decoding loops, methods,
generation or the tools.
"""
