"""Checks of a generation request's plain values, made before anything is read or loaded: a bad
value is one UsageError naming the parameter (as the library spells it, `top_p`, not `--top-p`),
never a torch or tokenizer traceback after minutes of loading, nor a crash after some output.

    prompts = check_prompts(prompts)                                  # generate()
    target, drafter = check_request(target, drafter, seed=seed, device=device, **options)  # plan()

Non-goals: what needs the models (prompt length in tokens, vocabularies) or models.yaml (names,
pair defaults) is checked where those are loaded. Torch-free, so the CLI may import it cheaply.
"""

from __future__ import annotations

import difflib
import math
import os
import sys
from collections.abc import Iterable
from typing import Any, TypeGuard

from .errors import InputError, UsageError
from .names import SCHEDULES
from .settings import DECLARED, OPTIONS, problem

MAX_THREADS = 1024  # torch CPU threads: more than any machine here has cores
SEED_MAX = 2**63 - 1  # prompt i draws from seed + i, which stays within torch's 64-bit seeds
RECORDED = ("gamma", "steps", "schedule")  # what a drafter records of the settings it was trained for


def check_prompts(prompts: object) -> list[str]:
    """A string or an iterable of strings -> the list of prompts, each encodable as UTF-8."""
    if isinstance(prompts, str):
        prompts = [prompts]
    elif not isinstance(prompts, Iterable) or isinstance(prompts, (bytes, dict)):
        raise UsageError(f"prompts must be a string or a list of strings, got {_kind(prompts)}")
    prompts = _listed(prompts, "prompts must be a string or a list of strings")
    for i, prompt in enumerate(prompts, 1):
        if not isinstance(prompt, str):
            raise UsageError(f"prompt {i} must be a string, got {_kind(prompt)}")
        check_text(prompt, f"prompt {i}")
    return prompts


def check_text(text: str, where: str) -> str:
    """text, if it can be written as UTF-8: no lone surrogate, which is what json.loads makes of
    "\\ud800" and Python of bytes in argv that are not UTF-8 (U+DC80..U+DCFF, surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        char = text[e.start]
        if "\udc80" <= char <= "\udcff":
            raise InputError(f"{where} is not valid UTF-8 (byte {ord(char) - 0xDC00:#x} at character "
                             f"{e.start})") from e
        raise InputError(f"{where} is not valid Unicode (lone surrogate {char!r} at character {e.start})") from e
    return text


def check_text_options(system: object, stop: object) -> tuple[str | None, tuple[str, ...]]:
    """A system message (None or text) and stop strings (None, one string or an iterable of
    non-empty strings), each encodable as UTF-8: a lone surrogate in one crashed the tokenizer
    (system) or could never match decoded text (stop). -> (system, stop as a tuple)."""
    if system is not None:
        if not isinstance(system, str):
            raise UsageError(f"`system` must be a string, got {_kind(system)}")
        check_text(system, "`system`")
    if stop is not None and not isinstance(stop, str) and not isinstance(stop, Iterable):
        raise UsageError(f"`stop` must be a string or a list of strings, got {_kind(stop)}")
    stop = (stop,) if isinstance(stop, str) else tuple(_listed(stop or (), "`stop` must be a string or a list of strings"))
    if not all(isinstance(s, str) and s for s in stop):
        raise UsageError(f"`stop` strings must be non-empty text, got {_short(stop)}")
    for i, s in enumerate(stop, 1):
        check_text(s, f"`stop` string {i}")
    return system, stop


def check_seed(seed: object) -> None:
    if not _is_int(seed) or not 0 <= seed <= SEED_MAX:
        raise UsageError(f"seed must be an integer from 0 to 2**63 - 1, got {_short(seed)}")


def check_indices(indices: object, n: int) -> list[int]:
    """Each prompt's place in a larger input (stream's `indices`): n integers from 0 to
    SEED_MAX, so that seed + index stays within torch's 64-bit seeds (2**64 overflowed inside it)."""
    if not isinstance(indices, (list, tuple)) or len(indices) != n or \
            not all(_is_int(i) and 0 <= i <= SEED_MAX for i in indices):
        raise UsageError(f"`indices` must be {n} integers from 0 to 2**63 - 1, one per prompt, got {_short(indices)}")
    return list(indices)


def check_settings(values: dict[str, Any]) -> None:
    """Each declared setting (settings.py) that `values` holds, not None, has its type and bound."""
    for key, value in values.items():
        message = problem(key, value) if key in DECLARED else None
        if message:
            raise UsageError(f"{message}, got {_short(value)}")


def check_threads(threads: object) -> None:
    """torch's CPU threads: None (as the process has them) or an integer 1..MAX_THREADS (10**20
    overflowed inside torch; 100000 threads ran the machine out of memory)."""
    if threads is not None and not (_is_int(threads) and 1 <= threads <= MAX_THREADS):
        raise UsageError(f"`threads` must be an integer from 1 to {MAX_THREADS}, got {_short(threads)}")


def check_keywords(given: Iterable[str], known: Iterable[str]) -> None:
    """Every keyword given is one of `known`: a misspelt setting (`temprature=0.8`) taken in by a
    **options parameter must not be dropped silently (greedy output instead of sampled)."""
    known = list(known)
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else f" (known: {', '.join(sorted(known))})"
            raise UsageError(f"unknown option `{key}`{hint}")


def check_names(**names: object) -> None:
    """Settings that name something (method, schedule, acceptance, ...): a string, or None for
    the default. A list or a number is refused here, not met later as a TypeError; an empty
    string names nothing and is refused, not taken for the default."""
    for key, value in names.items():
        if value is not None and not isinstance(value, str):
            raise UsageError(f"`{key}` must be a name (a string), got {_kind(value)}")
        if value == "":
            raise UsageError(f"`{key}` must be a name, got '' (None or leaving it out: the default)")


def check_flags(**flags: object) -> None:
    """Switches (chat, truncate_prompt, ...): True, False, or None for the default."""
    for key, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise UsageError(f"`{key}` must be True or False, got {_short(value)}")


def check_named(name: object, role: str) -> None:
    """A model given by name: '' names none (as a path it is the current directory, "no model
    here"; beside a pair it was taken for the pair's model)."""
    if name == "":
        raise UsageError(f"`{role}` is empty: give a models.yaml name, a directory or a hub id")


def check_model(model: object, role: str) -> None:
    """A model as plan() takes it: None, a name or a path, or a loaded object (which plan checks
    once loaded); a number, bytes or a container names nothing."""
    if isinstance(model, (bool, int, float, bytes, list, tuple, dict, set)):
        raise UsageError(f"`{role}` must be a models.yaml name, a directory, a hub id or a loaded {role} "
                         f"(specdiff.load_{role}), got {_kind(model)}")


def check_request(target: Any, drafter: Any, *, seed: object, device: object, temperature: object = None,
                  top_k: object = None, top_p: object = None, repetition_penalty: object = None,
                  **options: object) -> tuple[Any, Any]:
    """Check what plan() is given before it reads anything; -> (target, drafter) with a path
    (os.PathLike) turned into the string that names it, anything else as given. `options`: some
    of settings.OPTIONS, no other name."""
    check_keywords(options, OPTIONS)
    check_model(target, "target")
    check_model(drafter, "drafter")
    check_names(schedule=options.get("schedule"), remasking=options.get("remasking"))
    check_seed(seed)
    check_settings({"temperature": temperature, "top_k": top_k, "top_p": top_p,
                    "repetition_penalty": repetition_penalty, **options})
    if device is not None:  # None: a loaded model's device, else cpu (generation.loaded)
        check_device_name(device)
    return _name(target), _name(drafter)


def check_device_name(device: object) -> None:
    """A device as torch names one: a string ('cpu', 'cuda:1') or a torch.device."""
    if not _is_device(device):
        raise UsageError(f"`device` must be a string such as 'cpu' or 'cuda:1', got {_kind(device)}")


def check_recorded(settings: object) -> dict[str, Any]:
    """A drafter's recorded draft settings (`defaults` in its config.json or an export manifest):
    an object with some of gamma and steps (integers >= 1) and schedule (a known name). -> a copy;
    ValueError naming the first problem (the reader says in which file)."""
    if not isinstance(settings, dict):
        raise ValueError(f"defaults must be an object, got {_kind(settings)}")
    unknown = [k for k in settings if k not in RECORDED]
    if unknown:
        raise ValueError(f"defaults: unknown setting {_short(unknown[0])} (known: {', '.join(RECORDED)})")
    for key in ("gamma", "steps"):
        if key in settings and not (_is_int(settings[key]) and settings[key] >= 1):
            raise ValueError(f"defaults: {key} must be an integer >= 1, got {_short(settings[key])}")
    if "schedule" in settings and settings["schedule"] not in SCHEDULES:
        raise ValueError(f"defaults: unknown schedule {_short(settings['schedule'])} (known: {', '.join(SCHEDULES)})")
    return dict(settings)


def _listed(values: Iterable[Any], message: str) -> list[Any]:
    """list(values); an object that claims to be iterable and is not (a 0-d tensor) is `message`."""
    try:
        return list(values)
    except TypeError as e:
        raise UsageError(f"{message}, got {_kind(values)}") from e


def _name(model: Any) -> Any:
    return os.fspath(model) if isinstance(model, os.PathLike) else model


def _is_device(x: object) -> bool:
    torch = sys.modules.get("torch")  # a torch.device exists only once torch is imported
    return isinstance(x, str) or (torch is not None and isinstance(x, torch.device))


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _kind(x: object) -> str:
    return "None" if x is None else type(x).__name__


def _short(x: object) -> str:
    """repr(x), cut to a readable length (a seed may have thousands of digits)."""
    if _is_int(x) and abs(x) >= 10**30:  # str() of a 5000-digit integer raises ValueError
        return f"an integer of about {int(x.bit_length() * math.log10(2)) + 1} digits"
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."
