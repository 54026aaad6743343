"""Training: `specdiff distill`, a drafter (diffusion, DFlash or EAGLE-3) distilled from its target's own output.

    distill.py      distill(cfg) -> report: the whole run, from the target to a published drafter
                    and report.json; build_data (`data_only`)
    reading.py      the run of the drafters that read the target's features (Reader, one per kind):
                    data and feature caches, draft vocabulary, resume, report
    dflash.py       `method` dflash: a DFlash drafter trained on blocks of the target's answers,
                    reading the target's features
    eagle3.py       `method` eagle3: an EAGLE-3 head trained on whole answers by the training-time
                    test (unrolled on its own output), reading the target's features
    features.py     the target's hidden states of the teacher sequences, cached (dflash, eagle3)
    evaluation.py   evaluate_drafter: tau and alpha of a drafter on held-out prompts
    config.py       DistillConfig (one field per CLI option), its checks, what a run derives from it
    teacher.py      the target's continuations of prompts (sampled, soft labels), or its reading of given
                    answers (prefill.py), cached resumably
    prefill.py      given answers (JSONL question / answer pairs) read by the target in one forward pass:
                    soft labels and features as the teacher loop keeps them
    sequences.py    Sequences (the teacher data's rows) and what generating and prefilling share: the
                    chat template, left padding, a call's features
    batches.py      examples shaped like a drafting call: Pattern, Batch, make_batch
    data.py         a run's data assembled once: sequences, raw text, validation batches
    drafter.py      the drafter a run starts from: new, through the target's embeddings, or given
    losses.py       Slots (the drafter's x0 logits at the draft slots, one pass) and the losses;
                    per_slot_loss (ce, kl, lk) of the drafters reading features
    loop.py         the optimizer loop over a Task: learning rate schedule, steps, validation loss;
                    DiffusionTask
    checkpoints.py  Task (what is trained and checkpointed), checkpoints and resume, the published
                    drafter, undoing a diverged run

The losses read DiffusionDrafter.x0_logits, the one chain from ids to x0 logits that drafting and
the exported graphs run too (specdiff.drafters.diffusion.x0_logits_from): training scores exactly
the distribution drafting samples from.

May import: the algorithm (drafters, nets, targets, loading, generation), which never imports
it, as for specdiff.tools; none of specdiff_cli, specdiff.exporters or specdiff.runtimes (tests/test_layout.py).
"""
