"""speed.cuda_graphs on a CPU: the static layout a replay runs (by hand, and the hidden
states of its real tokens equal the unpadded forward's), the micro-batches it leaves to
the eager path, and the setting refused off CUDA. The replay itself:
test_body_graphs_gpu.py."""

from __future__ import annotations

import pytest
import torch

from danka.errors import UserError
from danka.models import body_graphs, varlen
from danka.models.tiny import tiny_causal_lm
from danka.schema.sections import SpeedConfig
from danka.trainer.components import cuda_graphs_line
from tests.models.test_varlen import batch


def test_static_layout_by_hand():
    flat = varlen.pack_flat(batch())  # 37 real tokens, cu 0 7 11 15 22 29 37, longest 8
    ids, pos, cu = body_graphs.static_layout(flat, tokens=56, max_len=8, n_cu=12)
    # 19 tokens of padding: sequences of 8, 8 and 3 after the real ones, then empty ones
    assert cu.tolist() == [0, 7, 11, 15, 22, 29, 37, 45, 53, 56, 56, 56]
    assert cu.dtype == torch.int32 and ids.shape == pos.shape == (1, 56)
    assert ids[0, :37].tolist() == flat.input_ids[0].tolist() and not ids[0, 37:].any()
    assert pos[0, :37].tolist() == flat.position_ids[0].tolist()
    assert pos[0, 37:].tolist() == [*range(8), *range(8), 0, 1, 2]


def test_static_layout_refuses_what_does_not_fit():
    flat = varlen.pack_flat(batch())
    assert body_graphs.static_layout(flat, tokens=36, max_len=8, n_cu=12) is None  # tokens
    assert body_graphs.static_layout(flat, tokens=56, max_len=7, n_cu=12) is None  # length
    assert body_graphs.static_layout(flat, tokens=56, max_len=8, n_cu=9) is None  # sequences
    exact = body_graphs.static_layout(flat, tokens=37, max_len=8, n_cu=7)
    assert exact[2].tolist() == flat.cu_seqlens.tolist()  # no padding at all


def test_real_tokens_of_the_static_layout_equal_the_unpadded_forward():
    torch.manual_seed(0)
    model = tiny_causal_lm(arch="qwen2").eval()
    flat = varlen.pack_flat(batch())
    with torch.no_grad():
        plain = varlen.varlen_forward(model.model, flat, "cpu")
        ids, pos, cu = body_graphs.static_layout(flat, tokens=64, max_len=8, n_cu=16)
        padded = varlen.eager_forward(model.model, ids, pos, cu, 8)
    assert padded.shape[0] == 64
    torch.testing.assert_close(padded[:37], plain, rtol=1e-5, atol=1e-5)


def test_without_cuda_the_session_changes_nothing():
    with body_graphs.session(tokens=1024, max_len=256, device="cpu") as s:
        assert s is None and body_graphs.current() is None
    body_graphs.flush()  # no session: nothing to do


def test_the_setting_is_refused_off_cuda():
    with pytest.raises(UserError) as err:
        cuda_graphs_line(SpeedConfig(cuda_graphs=True), torch.device("cpu"))
    assert err.value.where == "speed.cuda_graphs" and "false" in err.value.fix
