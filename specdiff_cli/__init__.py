"""The `specdiff` command line: a thin Click layer over the library, one module per command
(generate, bench, distill, drafter, export, models) plus what they share: prompts (reading
prompt files and stdin), output (atomic files, stdout layouts), flags (library errors named as
flags), threads, ray_run (generate --ray).

May import: everything (specdiff, its runtimes and exporters); nothing imports it. Heavy modules (torch)
are imported inside commands so that `specdiff --help` stays fast.
"""
