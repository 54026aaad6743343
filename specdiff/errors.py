"""User-facing errors. Every message here is meant to be read by a person as one line.

`SpecdiffError.exit_code` is what the CLI exits with: 2 for a usage error (the request itself is
wrong: bad option values, unknown names, malformed input), 1 for a runtime error (the request is
fine but something it needs is missing, corrupt or incompatible).
"""


class SpecdiffError(Exception):
    """Base class: a problem the user can fix, described in one line."""

    exit_code = 1


class UsageError(SpecdiffError):
    """The request is malformed: bad parameters, unknown names, bad prompts."""

    exit_code = 2


class RegistryError(UsageError):
    """models.yaml is malformed or does not name the model asked for."""


class InputError(UsageError):
    """Prompts that cannot be used: empty, too long, not UTF-8, malformed JSONL."""


class LoadError(SpecdiffError):
    """A model or artefact could not be loaded: missing, corrupt or incompatible files."""


class IncompatibleModelsError(LoadError):
    """Drafter and target cannot be paired (different tokenizers, vocabularies)."""


class DivergedError(SpecdiffError):
    """Training stopped because its loss or weights are no longer finite numbers."""


class WriteError(SpecdiffError):
    """An output could not be written: disk full, file too large, read-only file system."""


class ExportValidationError(SpecdiffError):
    """An exported graph disagrees with PyTorch beyond its dtype's tolerance; `mismatches` lists
    every disagreement found on the validation sweep."""

    def __init__(self, graph: str, mismatches: list[str], checks: int):
        self.mismatches = list(mismatches)
        shown = "; ".join(self.mismatches[:3]) + ("; ..." if len(self.mismatches) > 3 else "")
        super().__init__(f"{graph} disagrees with PyTorch in {len(self.mismatches)} of {checks} checks: {shown}")


class ModelOutputError(SpecdiffError):
    """A model produced unusable output, such as NaN or infinite logits (broken weights, or a dtype
    too narrow for its activations)."""


class SpecdiffWarning(UserWarning):
    """Something the user asked for cannot be done in full, and the run goes on without it."""


class DefaultPairWarning(SpecdiffWarning):
    """The default pair's models are not installed; the next default (the offline demo) runs."""


class UntrainedDrafterWarning(SpecdiffWarning):
    """The drafter's config says it is untrained (`drafter init` writes random weights): almost no
    draft is accepted (tau about 1), so decoding is slower than plain ar, not faster."""


class WidthDependenceWarning(SpecdiffWarning):
    """Greedy speculative decoding in half precision: its logits depend on how many tokens a call
    carries, so a verify call can pick another argmax than plain decoding's one-token call."""


class ContextWindowWarning(SpecdiffWarning):
    """`max_new_tokens` reaches past the target's context window: generation stops at the window
    (stop reason "context") with fewer tokens than asked for."""
