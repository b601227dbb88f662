"""The errors every layer may raise (a leaf: imports nothing from grpolab)."""
from __future__ import annotations

import contextlib


class ConfigError(ValueError):
    """A bad key or value; the message names it and says what is valid."""


class UnknownComponentError(KeyError):
    """Raised when a name is not registered; the message lists valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class WriteError(RuntimeError):
    """A file of the run could not be written (a full disk, a quota, an I/O error); the message names the path,
    the cause and what happens next (train/rundir.py: write_failure)."""


class RunFolderBusy(ConfigError):
    """Another process trains in the run folder (train/runlock.py); the message names it (pid, host) and what
    to do. Nothing in the folder was changed."""


class RunStalled(RuntimeError):
    """A run stopped because nothing could be learned (``stall_steps``); the message says why and what to change."""


class FallbackWarning(UserWarning):
    """A component's defining input is missing at run time and a stand-in is used instead.

    The run then does not execute the published method exactly (e.g. a reference reward replaced by a
    running mean, a per-task weight with no task column). Emitted only through :func:`warn_fallback`, so
    one filter sees every stand-in: ``warnings.simplefilter("error", FallbackWarning)`` turns them into
    errors (``tests/test_no_fallbacks.py`` does, running every recipe).
    """


class OptionalDependencyWarning(FallbackWarning):
    """An optional package is absent and a documented equivalent path is used (e.g. math-verify absent:
    the comparison of ``rewards/answers.py``). Visible, but not a stand-in for a method's input."""


def warn_fallback(component: str, missing: str, used: str, *, category: type = FallbackWarning) -> None:
    """Report that ``component`` lacks ``missing`` and uses ``used`` instead (one message form, one category)."""
    import warnings

    warnings.warn(f"{component}: {missing} is missing; using {used} instead", category, stacklevel=3)


class StandInError(ConfigError):
    """A method's defining input is missing at run time and the run does not allow stand-ins
    (``allow_stand_ins: false``, the default): the message names what is missing and the fix."""


@contextlib.contextmanager
def stand_in_policy(allow: bool):
    """Within this block a :class:`FallbackWarning` is an error (:class:`StandInError`) unless ``allow``;
    :class:`OptionalDependencyWarning` (a documented equivalent for an absent package) always stays a
    warning. The trainer wraps every step in it, so a recipe named after a paper never quietly runs a
    stand-in."""
    if allow:
        yield
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        warnings.simplefilter("default", OptionalDependencyWarning)
        try:
            yield
        except FallbackWarning as w:
            raise StandInError(f"{w}. The selected method needs it: provide it (see the component's docs: "
                               f"grpolab components), or set allow_stand_ins: true to train with the stand-in "
                               f"(reported as a warning)") from None


def warn_line(*parts) -> None:
    """Print a warning or error line to stderr, on a line of its own even while a progress bar is drawn there
    (``tqdm.write`` clears the bar, prints, and draws it again below); the default ``log`` of the trainer and
    the reward scorer."""
    import sys

    text = " ".join(map(str, parts))
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        print(text, file=sys.stderr, flush=True)
        return
    tqdm.write(text, file=sys.stderr)
    sys.stderr.flush()


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded: corrupt, or holding objects a safe (code-free) load refuses."""


def refused_pickle(file, exc: BaseException, advice: str) -> CheckpointError:
    """The error for a pickle ``torch.load(weights_only=True)`` refused: one line naming ``file`` and what the
    restricted unpickler refused (the class or function the pickle asks for), followed by ``advice``.

    PyTorch's own message is a screenful that ends in how to load the file anyway (``weights_only=False``,
    allow-listing the global): a security refusal never suggests the unsafe path, so none of it is repeated.
    """
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    m = (re.search(r"GLOBAL (\S+) (?:was not an allowed global|whose module)", text)
         or re.search(r"call reduce for unrecognized function (\S+)", text)
         or re.search(r"unsupported class (\S+)", text, re.IGNORECASE))
    if m:
        what = f"the unpickler refused {m.group(1).strip('.,`')!r}, a class or function a weights-only load " \
               f"does not allow: loading it could run code"
    else:
        m = re.search(r"WeightsUnpickler error: ([^\n]+)", text) or re.search(r"(Unsupported operand \S+)", text)
        detail = m.group(1).split(" Please ")[0].strip() if m else type(exc).__name__
        what = f"the unpickler refused it ({detail[:200]}): it holds more than tensors and plain data"
    return CheckpointError(f"{file}: refused to load: {what}. {advice}")


class RolloutWorkerDied(RuntimeError):
    """A rollout worker (a Ray actor) died mid-run; the message says which one, the likely cause and the command
    that resumes the run from its last checkpoint."""
