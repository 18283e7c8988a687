import torch

from danka.algorithms import masked_mean, masked_var, masked_whiten


def test_masked_mean_ignores_padding_and_empty_rows():
    x = torch.tensor([[1.0, 3.0, 100.0], [7.0, 7.0, 7.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # row 0: (1 + 3) / 2 = 2; row 1 has no valid token -> 0, not NaN
    assert torch.allclose(masked_mean(x, m, dim=-1), torch.tensor([2.0, 0.0]))
    assert torch.isclose(masked_mean(x, m), torch.tensor(2.0))


def test_masked_var_unbiased_and_whiten():
    x = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # mean 2, squared deviations 1 + 0 + 1 = 2, unbiased var = 2 / (3 - 1) = 1
    assert torch.isclose(masked_var(x, m), torch.tensor(1.0))
    w = masked_whiten(x, m)
    assert torch.allclose(w[0, :3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6)
    # shift_mean=False adds the mean (2) back
    w2 = masked_whiten(x, m, shift_mean=False)
    assert torch.allclose(w2[0, :3], torch.tensor([1.0, 2.0, 3.0]), atol=1e-6)


def test_masked_var_single_token_is_zero():
    # one valid entry: Bessel's n/(n-1) would divide by zero, so it is skipped
    assert masked_var(torch.tensor([[4.0, 9.0]]), torch.tensor([[1.0, 0.0]])) == 0.0
