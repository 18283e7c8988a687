"""One exception type for bad user input: the CLI prints it and exits with code 2.

Exit codes of ``danka`` (README, troubleshooting): 0 done; 1 a bug in danka (traceback);
2 bad input (config, data, reward code, model folder, checkpoint); 3 a fault during
training (disk full, non-finite steps, out of memory); 130 interrupted (SIGINT); 143
terminated (SIGTERM).

Libraries that danka calls (transformers, torch, safetensors, gguf) report a broken user
file with their own exception types. :func:`as_user_error` recognises those cases (a
refused pickle, a broken ``config.json``, a truncated weights file, a model that needs its
own code, a full disk) and turns them into the same one-line message with the file and
the fix, so no user mistake reads as a crash.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class UserError(Exception):
    """Bad input from the user: config, data row, reward function, checkpoint.

    ``where`` names the file, key or line; ``fix`` says what to change. The CLI prints
    ``str(err)`` (no traceback unless ``--debug``) and exits with code 2.
    """

    exit_code = 2

    def __init__(self, what: str, where: str | None = None, fix: str | None = None):
        self.what, self.where, self.fix = what, where, fix
        super().__init__(self._text())

    def _text(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        return text + (f"\n  fix: {self.fix}" if self.fix else "")

    def located(self, where: str) -> UserError:
        """This error, said at ``where`` instead (a bare config key made the override or
        the file's line that set it: danka.config.load.located)."""
        self.where = where
        self.args = (self._text(),)
        return self


class DiskFull(UserError):
    """The disk (or quota) filled up while danka wrote a file: a training fault, exit 3."""

    exit_code = 3


# names of the variables that hold the file being read, in the frames of the libraries
_FILE_VARS = (
    "f",
    "checkpoint_file",
    "filename",
    "file_path",
    "path",
    "gguf_path",
    "resolved_config_file",
)
_LIBRARIES = ("torch", "transformers", "safetensors", "gguf", "peft", "huggingface_hub", "danka")


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none): what a
    UserError keeps of a library's error, without the traceback."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@contextmanager
def library_errors(
    kinds: tuple[type[Exception], ...], what: str, where: str, fix: str
) -> Iterator[None]:
    """Inside the block, a library's error of ``kinds`` (a file or model it cannot take)
    becomes a UserError ``what: <its first line>`` with ``where`` and ``fix``; the
    library's message is kept, its traceback is not."""
    try:
        yield
    except kinds as err:
        raise UserError(f"{what}: {first_line(err)}", where=where, fix=fix) from err


def _frames(exc: BaseException):
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return reversed(frames)  # innermost first


def _file_of(exc: BaseException) -> str | None:
    """The user file a library was reading when ``exc`` was raised (from the local variables
    of its frames, innermost first), or None."""
    for frame in _frames(exc):
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in _LIBRARIES:
            continue
        for name in _FILE_VARS:
            value = frame.f_locals.get(name)
            if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
                return str(value)
            value = getattr(value, "name", None)  # an open file object
            if isinstance(value, str) and os.path.isfile(value):
                return value
    return None


def _raised_in(exc: BaseException, package: str) -> bool:
    return any(
        frame.f_globals.get("__name__", "").split(".")[0] == package for frame in _frames(exc)
    )


def as_user_error(exc: BaseException) -> UserError | None:
    """``exc`` as a UserError when the user's input caused it (see the module docstring),
    else None (a bug: the CLI shows the traceback)."""
    if isinstance(exc, UserError):
        return exc
    text = str(exc)
    name = type(exc).__name__
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if full or "No space left on device" in text or "Disk quota exceeded" in text:
        where = getattr(exc, "filename", None) or _file_of(exc)
        return DiskFull(
            "no space left on the device",
            where=str(where) if where else None,
            fix="free disk space (or move output_dir), then continue with --resume auto",
        )
    if name == "UnpicklingError" and "Weights only load failed" in text:
        file = _file_of(exc)
        return UserError(
            "this file is a Python pickle that needs more than tensors to load (it could run "
            "code); danka loads weights with torch.load(weights_only=True) and refused it",
            where=file or "a .bin/.pt file of the model or checkpoint",
            fix="use safetensors weights (model.safetensors, adapter_model.safetensors); "
            "convert the file yourself only if you trust where it came from",
        )
    if "is not a valid JSON file" in text:
        quoted = re.search(r"'([^']+)'", text)
        return UserError(
            "this JSON file is broken (it does not parse)",
            where=quoted.group(1) if quoted else _file_of(exc),
            fix="restore the file from the original model or download it again; "
            "check it with python -m json.tool FILE",
        )
    if "Unrecognized model in" in text and "model_type" in text:
        folder = re.search(r"Unrecognized model in (.+?)\. Should", text)
        return UserError(
            "this folder is not a Hugging Face model folder (no config.json with a model_type)",
            where=folder.group(1) if folder else None,
            fix="give a model folder (config.json + weights), a .gguf file or a Hub id",
        )
    if "contains custom code which must be executed" in text:
        repo = re.search(r"The repository (\S+) contains", text)
        return UserError(
            f"the model {repo.group(1) if repo else ''} needs its own Python code to load, "
            "and model.trust_remote_code is false (nothing was run)".replace("  ", " "),
            where="model.trust_remote_code",
            fix="read the model's .py files; set model.trust_remote_code: true only if you "
            "trust them, or use a model that transformers supports natively",
        )
    if _raised_in(exc, "gguf") and isinstance(exc, (ValueError, IndexError, KeyError, OSError)):
        file = _file_of(exc)
        return UserError(
            f"the GGUF file is truncated or damaged ({name}: {text[:120]})",
            where=file or "model.actor_model_name_or_path",
            fix="download the .gguf file again and compare its size with the original",
        )
    if name == "SafetensorError" and "deserializ" in text:  # reading, not writing
        file = _file_of(exc)
        return UserError(
            f"this safetensors file is truncated or damaged ({text[:160]})",
            where=file or "a .safetensors file of the model or checkpoint",
            fix="restore or download the file again; for a checkpoint resume from another "
            "one (--resume PATH) or use --resume auto",
        )
    return None


def output_dir_error(output_dir: Path, err: OSError, flag: str = "output_dir") -> UserError:
    """The message for an output dir danka cannot create or write (read-only filesystem,
    no permission, a file in the way); ``flag``: what the user set it with (``--output``)."""
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        what = f"{flag} is a file (or a path through a file), not a folder"
    elif err.errno == errno.EROFS:
        what = f"{flag} is on a read-only filesystem"
    elif isinstance(err, PermissionError):
        what = f"no permission to write in {flag}"
    else:
        what = f"cannot create or write {flag} ({err.strerror or err})"
    fix = (
        "set --output-dir (or output_dir:) to a writable folder, e.g. ./runs/my_run"
        if flag == "output_dir"
        else f"give {flag} a path in a writable folder"
    )
    return UserError(what, where=str(output_dir), fix=fix)
