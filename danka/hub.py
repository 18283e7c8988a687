"""``danka push RUN_OR_CHECKPOINT REPO_ID``: upload a trained model to the Hugging Face Hub.

What goes up is one folder: a checkpoint (``OUTPUT/actor/checkpoint_N``: adapter or full
model), a run folder's newest checkpoint, or a ``danka export`` folder (merged model, and
its ``.gguf`` if exported). Every such folder danka wrote has its model card
(``README.md``, :mod:`danka.model_card`); a checkpoint from an older danka gets one from
its ``danka_training.json`` when that exists. The upload is ``huggingface_hub``'s
``create_repo(exist_ok=True)`` + ``upload_folder`` (one commit); hidden files are left out.

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


def ensure_card(folder: Path, log: Callable[[str], Any] = print) -> bool:
    """A model card in ``folder`` (written from ``danka_training.json`` if missing);
    returns whether the folder has one."""
    from danka.model_card import CARD_FILE, read_training_info, write_folder_card

    if (folder / CARD_FILE).is_file():
        return True
    info = read_training_info(folder)
    if info is None:
        log(f"warning: {folder} has no model card (README.md) and no danka_training.json")
        return False
    write_folder_card(folder, info)
    log(f"wrote the model card {folder / CARD_FILE}")
    return True


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
            return UserError(
                f"the Hub refused the token for {repo_id} ({status}): {first_line(err)}",
                where="danka push",
                fix="use a token with write access to that namespace (hf auth login)",
            )
        return UserError(f"the Hub answered {status}: {first_line(err)}", where="danka push",
                         fix="check the repo id (owner/name) and try again")  # fmt: skip
    return UserError(
        f"cannot reach the Hugging Face Hub at {endpoint} ({type(err).__name__}: {err})",
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
    from huggingface_hub import HfApi, constants

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UserError(
            f"{repo_id!r} is not a repo id",
            where="REPO_ID",
            fix="write it as owner/name, e.g. me/smollm2-grpo-arithmetic",
        )
    folder = folder_to_push(path)
    ensure_card(folder, log)
    endpoint = endpoint or constants.ENDPOINT
    api = HfApi(endpoint=endpoint, token=_token(token))
    files = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]
    size = sum(p.stat().st_size for p in files)
    log(f"pushing {folder} ({len(files)} files, {size / 2**20:.1f} MiB) to {endpoint}/{repo_id}")
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message or f"danka: upload {folder.name}",
            ignore_patterns=[".*", "**/.*"],
        )
    except Exception as err:  # noqa: BLE001 - every failure becomes one message
        raise _hub_error(err, endpoint, repo_id) from err
    url = str(getattr(info, "commit_url", "") or f"{endpoint}/{repo_id}")
    log(f"pushed: {url}")
    return url
