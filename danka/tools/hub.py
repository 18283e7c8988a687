"""``danka push RUN_OR_CHECKPOINT REPO_ID``: upload a trained model to the Hugging Face Hub.

What goes up is one folder: a checkpoint (``OUTPUT/actor/checkpoint_N``: adapter or full
model), a run folder's newest checkpoint, or a ``danka export`` folder (merged model, and
its ``.gguf`` if exported). Every such folder danka wrote has its model card
(``README.md``, :mod:`danka.model_card`); a checkpoint from an older danka gets one from
its ``danka_training.json`` when that exists, uploaded from memory: the folder is never
changed. The upload is ``huggingface_hub``'s ``create_repo(exist_ok=True)`` +
``create_commit`` (one commit); hidden files are left out. An endpoint's credentials
(``https://user:secret@host``) are never shown in a message or log line.

The token is the usual one (``HF_TOKEN``, or ``hf auth login``); ``HF_ENDPOINT`` or
``endpoint=`` picks another Hub. Without a token, offline (``HF_HUB_OFFLINE``) or without a
route to the Hub, a UserError says so (exit 2), before anything is uploaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from danka.errors import UserError, first_line


def folder_to_push(path: str | Path) -> Path:
    """The folder ``path`` means: itself when it is a model, adapter or export folder, a
    run folder's newest checkpoint otherwise."""
    from danka.tools.locate import resolve_checkpoint

    folder = Path(path).expanduser()
    if folder.is_dir() and any(folder.glob("*.gguf")):
        return folder  # a GGUF export folder
    return resolve_checkpoint(folder, flag="RUN_OR_CHECKPOINT")


def missing_card(folder: Path, log: Callable[[str], Any] = print) -> bytes | None:
    """The model card to upload with ``folder`` when it has no ``README.md``: written from
    its ``danka_training.json``, in memory (the folder itself is never changed: a push
    that fails leaves it as it was). None when it has a card, or nothing to write one."""
    from danka.model_card import CARD_FILE, card_text, read_training_info

    if (folder / CARD_FILE).is_file():
        return None
    info = read_training_info(folder)
    if info is None:
        log(f"warning: {folder} has no model card (README.md) and no danka_training.json")
        return None
    log(f"uploading a model card written from {folder / 'danka_training.json'}")
    return card_text(info, what="checkpoint").encode("utf-8")


def redact(url: str) -> str:
    """``url`` without credentials: ``https://user:secret@host/x?token=y`` ->
    ``https://***@host/x`` (what messages and logs show of an endpoint)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<the endpoint>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _token(token: str | None) -> str:
    from huggingface_hub import get_token

    found = token or get_token()
    if not found:
        raise UserError(
            "no Hugging Face token: danka push needs one with write access",
            where="danka push",
            fix="run `hf auth login`, or set HF_TOKEN (a write token from "
            "huggingface.co/settings/tokens)",
        )
    return found


def _hub_error(err: Exception, endpoint: str, repo_id: str) -> UserError:
    """The one-line reason an upload failed."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(err, OfflineModeIsEnabled):
        return UserError(
            "HF_HUB_OFFLINE is set: nothing can be uploaded",
            where="danka push",
            fix="unset HF_HUB_OFFLINE (and make sure the Hub can be reached)",
        )
    if isinstance(err, HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            shown = first_line(err).replace(endpoint, redact(endpoint))
            return UserError(
                f"the Hub refused the token for {repo_id} ({status}): {shown}",
                where="danka push",
                fix="use a token with write access to that namespace (hf auth login)",
            )
        shown = first_line(err).replace(endpoint, redact(endpoint))
        return UserError(
            f"the Hub answered {status}: {shown}",
            where="danka push",
            fix="check the repo id (owner/name) and try again",
        )
    detail = str(err).replace(endpoint, redact(endpoint))
    return UserError(
        f"cannot reach the Hugging Face Hub at {redact(endpoint)} ({type(err).__name__}: {detail})",
        where="danka push",
        fix="check the network or proxy (or HF_ENDPOINT); the folder is unchanged, push "
        "it later with the same command",
    )


def push(
    path: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    commit_message: str | None = None,
    log: Callable[[str], Any] = print,
) -> str:
    """Upload the folder ``path`` means (:func:`folder_to_push`) to the model repo
    ``repo_id`` (created if missing). Returns the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    from danka.model_card import CARD_FILE

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UserError(
            f"{repo_id!r} is not a repo id",
            where="REPO_ID",
            fix="write it as owner/name, e.g. me/smollm2-grpo-arithmetic",
        )
    folder = folder_to_push(path)
    card = missing_card(folder, log)
    endpoint = endpoint or constants.ENDPOINT
    api = HfApi(endpoint=endpoint, token=_token(token))
    files = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    size = sum(p.stat().st_size for p in files)
    log(
        f"pushing {folder} ({len(files)} files, {size / 2**20:.1f} MiB) to "
        f"{redact(endpoint)}/{repo_id}"
    )
    ops = [CommitOperationAdd(p.relative_to(folder).as_posix(), str(p)) for p in files]
    if card is not None:
        ops.append(CommitOperationAdd(CARD_FILE, card))
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations=ops,
            commit_message=commit_message or f"danka: upload {folder.name}",
        )
    except Exception as err:  # noqa: BLE001 - every failure becomes one message
        raise _hub_error(err, endpoint, repo_id) from None
    url = str(getattr(info, "commit_url", "") or f"{redact(endpoint)}/{repo_id}")
    log(f"pushed: {url}")
    return url
