"""The tied loss's Triton block kernel against its NumPy twin (``kernels.reference``), and run to run on one device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")          # the optional gpu extra

from tests.tolerances import TOL  # noqa: E402
from tokenpos.kernels.reference import tied_loss_block_ref  # noqa: E402
from tokenpos.kernels.triton import tied_loss_block  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402

TOL_CE = TOL["triton.cross_entropy"]


def _case(gen: torch.Generator, mode: int, cap: float | None, c: int = 5, Vl: int = 2500) -> dict:
    z = 3 * torch.randn(c, Vl, generator=gen)
    z[0, 5] = 60.0                                       # far above the rest of its row
    z[1, 1500] = 40.0                                    # the running max grows in a later column block
    t = torch.randint(-1, Vl, (c,), generator=gen)
    t[2] = -1                                            # no target column here
    coef = None if mode == 0 else torch.rand(c, generator=gen)
    lse = None
    if mode == 2:
        zc = z.double() if cap is None else cap * torch.tanh(z.double() / cap)
        lse = (torch.logsumexp(zc, 1) + 0.25).float()
    return {"z": z, "t": t, "coef": coef, "lse": lse}


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("cap", [None, 5.0])
def test_block_matches_the_twin(device: torch.device, gen: torch.Generator, mode: int, cap: float | None) -> None:
    c = _case(gen, mode, cap)
    kw = {"eps": 0.1, "vocab_size": 2600, "softcap": cap}
    ref_z = c["z"].numpy().copy()
    ref = tied_loss_block_ref(ref_z, c["t"].numpy(), coef=None if c["coef"] is None else c["coef"].numpy(),
                              lse=None if c["lse"] is None else c["lse"].numpy(), **kw)
    z = c["z"].clone().to(device)
    stats = tied_loss_block(z, c["t"].to(device), coef=None if c["coef"] is None else c["coef"].to(device),
                            lse=None if c["lse"] is None else c["lse"].to(device), **kw)
    assert stats.shape == ((0, 4) if mode == 2 else (5, 4))
    if mode != 2:
        np.testing.assert_allclose(stats[:, :3].cpu().numpy(), ref[:, :3], **TOL_CE)
        scale = np.abs(ref_z if mode == 0 else c["z"].numpy()).sum(axis=1)     # sums: rounding of sum |z|
        assert np.all(np.abs(stats[:, 3].cpu().numpy() - ref[:, 3]) <= TOL_CE["rtol"] * scale)
    np.testing.assert_allclose(z.cpu().numpy(), ref_z, **TOL_CE)


def test_same_bits_run_to_run(device: torch.device, gen: torch.Generator) -> None:
    """No atomics, one program per row, columns in order: the same inputs give the same bits on one device."""
    c = _case(gen, 1, 5.0)
    outs = []
    for _ in range(2):
        z = c["z"].clone().to(device)
        outs.append((tied_loss_block(z, c["t"].to(device), coef=c["coef"].to(device), eps=0.1, softcap=5.0), z))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


def test_refuses_other_dtypes_and_shapes(device: torch.device, gen: torch.Generator) -> None:
    z = torch.randn(3, 7, device=device)
    with pytest.raises(ConfigError, match="float32"):
        tied_loss_block(z.double(), torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(ConfigError, match="t must be"):
        tied_loss_block(z, torch.zeros(4, dtype=torch.int64, device=device))
    with pytest.raises(ConfigError, match="lse is only used with coef"):
        tied_loss_block(z, torch.zeros(3, dtype=torch.int64, device=device), lse=torch.zeros(3, device=device))
