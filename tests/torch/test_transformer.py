"""TransformerEmbedding: validated once, one ``tokenpos::embedding`` call where the block fuses; the
kernel path equals the plain path; scheme objects; torch.func; threads; outputs never alias."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tokenpos
import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.frames import tokenpos_frames_above
from tests.threads import run_threads
from tests.tolerances import TOL
from tokenpos.kernels import embedding_forward
from tokenpos.tables.errors import ConfigError, TokenIdError
from tokenpos.tables.formulas.dropout import SEED_MASK, dropout_keep_mask

IDS = torch.tensor([[0, 0, 0, 5, 9, 5, 49], [3, 3, 7, 0, 11, 2, 5]])          # padding and duplicates


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = torch.float32, msg: str = "") -> None:
    tol = TOL["kernels.float32"] if dtype == torch.float32 else TOL["kernels.float64"]
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **tol, err_msg=msg)


def run(kernels: bool, positions=None, start_pos: int = 2, **kwargs):
    tokenpos.set_kernels(kernels)
    torch.manual_seed(123)                                 # the dropout seed comes from torch's generator
    emb = tpt.TransformerEmbedding(50, 12, 16, seed=3, num_heads=3, padding_idx=0, **kwargs)
    out = emb(IDS, positions, start_pos=start_pos)
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (out * g).sum().backward()
    return out, {n: p.grad for n, p in emb.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi", "t5", "none"])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_path_equals_plain_path(kernel_calls, positional, scale, dropout, dtype) -> None:
    kwargs = dict(positional=positional, scale=scale, dropout=dropout, dtype=dtype)
    out_k, grads_k = run(True, **kwargs)
    assert kernel_calls["forward"] == 1 and kernel_calls["backward"] == 1     # the whole block: one op
    out_r, grads_r = run(False, **kwargs)
    assert kernel_calls["forward"] == 1
    assert out_k.dtype == out_r.dtype == dtype
    assert torch.equal(out_k, out_r)                                         # bit for bit, same mask
    assert grads_k.keys() == grads_r.keys()
    for name in grads_k:
        close(grads_k[name], grads_r[name], dtype, name)
    assert not grads_k["token.weight"][0].any()                              # padding row: no gradient


@pytest.mark.parametrize("positions", [torch.tensor([4, 0, 15, 2, 2, 9, 1]),
                                       torch.tensor([[0, 1, 2, 3, 4, 5, 6], [15, 14, 3, 3, 0, 1, 2]])])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_explicit_positions(kernel_calls, positions, positional) -> None:
    out_k, grads_k = run(True, positions, start_pos=0, positional=positional, dropout=0.2, scale=True)
    out_r, grads_r = run(False, positions, start_pos=0, positional=positional, dropout=0.2, scale=True)
    assert kernel_calls["forward"] == 1
    assert torch.equal(out_k, out_r)
    for name in grads_r:
        close(grads_k[name], grads_r[name], torch.float32, name)


def test_roberta_positions_norm_token_types_and_1d_ids(kernel_calls) -> None:
    for kwargs in ({"position_ids": "padding"}, {"norm": "layernorm", "num_token_types": 2}):
        for ids in (IDS, IDS[1]):
            outs = []
            for kernels in (True, False):
                tokenpos.set_kernels(kernels)
                emb = tpt.TransformerEmbedding(50, 8, 16, padding_idx=0, seed=0, **kwargs)
                outs.append(emb(ids))
            assert torch.equal(*outs)
    assert kernel_calls["forward"] == 8            # token rows + position (or token-type) rows: two op calls


def test_sinusoidal_beyond_the_table(kernel_calls) -> None:
    emb = tpt.TransformerEmbedding(50, 8, 4, positional="sinusoidal", seed=0)
    out = emb(IDS[:, :3], start_pos=3)                                      # positions 3..5 > 4 rows
    ref = emb.token(IDS[:, :3]) + emb.position(torch.arange(3, 6))
    assert torch.equal(out, ref) and kernel_calls["forward"] == 2          # token rows, then the formula


def test_dropout_reproduces_from_the_generator_and_matches_the_kernel() -> None:
    emb = tpt.TransformerEmbedding(50, 12, 16, scale=True, dropout=0.4, seed=3)
    emb.generator = torch.Generator().manual_seed(7)                        # draws the dropout seeds
    out = emb(IDS, start_pos=1)
    seed = int(torch.randint(0, SEED_MASK, (), generator=torch.Generator().manual_seed(7), dtype=torch.int64))
    ref = embedding_forward(emb.token.weight.detach().numpy(), IDS.numpy(), scale=emb.token.multiplier,
                            pos_table=emb.position.weight.detach().numpy(), pos_ids=np.arange(1, 8),
                            dropout_p=0.4, seed=seed)
    np.testing.assert_array_equal(out.detach().numpy(), ref)
    np.testing.assert_array_equal(out.detach().numpy() != 0, dropout_keep_mask(seed, (2, 7, 12), 0.4))
    torch.manual_seed(5)
    a = tpt.TransformerEmbedding(50, 12, 16, dropout=0.4, seed=3)(IDS)
    torch.manual_seed(5)
    b = tpt.TransformerEmbedding(50, 12, 16, dropout=0.4, seed=3)(IDS)
    assert torch.equal(a, b)


@pytest.mark.parametrize("frozen", ["token", "position", "both"])
def test_frozen_tables_get_no_gradient(kernel_calls, frozen) -> None:
    results = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, padding_idx=0, seed=0)
        if frozen in ("token", "both"):
            emb.token.weight.requires_grad_(False)
        if frozen in ("position", "both"):
            emb.position.weight.requires_grad_(False)
        torch.manual_seed(0)
        out = emb(IDS)
        assert out.requires_grad == (frozen != "both")
        if out.requires_grad:
            out.pow(2).sum().backward()
        results.append((out, emb.token.weight.grad, emb.position.weight.grad))
    (out_k, tok_k, pos_k), (out_r, tok_r, pos_r) = results
    assert torch.equal(out_k, out_r)
    for a, b in ((tok_k, tok_r), (pos_k, pos_r)):
        assert (a is None) == (b is None)
        if a is not None:
            close(a, b)
    assert kernel_calls["backward"] == (0 if frozen == "both" else 1)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_no_grad_modes(kernel_calls, mode) -> None:
    emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, seed=0)
    with mode():
        torch.manual_seed(0)
        out = emb(IDS)
    assert out.grad_fn is None and not out.requires_grad and kernel_calls["forward"] == 1
    tokenpos.set_kernels(False)
    with mode():
        torch.manual_seed(0)
        assert torch.equal(out, emb(IDS))


def test_low_precision_and_empty_ids(kernel_calls) -> None:
    for dtype in (torch.bfloat16, torch.float16):
        emb = tpt.TransformerEmbedding(50, 8, 16, scale=True, dtype=dtype, seed=0)
        out = emb(IDS)
        out.float().sum().backward()
        w, t = emb.token.weight.detach().float(), emb.position.weight.detach().float()
        ref = (w[IDS] * emb.token.multiplier + t[:7]).to(dtype)             # fp32, rounded once
        assert out.dtype == dtype and torch.equal(out, ref) and emb.token.weight.grad is not None
    emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, seed=0)
    out = emb(torch.zeros(2, 0, dtype=torch.int64))
    assert out.shape == (2, 0, 8)
    out.sum().backward()
    assert not emb.token.weight.grad.any()


BAD_CALLS = [
    ((torch.tensor([[1, 50, 2]]),), {}),                                   # id out of range
    ((torch.tensor([[1, -1, 2]]),), {}),                                   # negative id
    ((torch.tensor([[1.0, 2.0]]),), {}),                                   # float ids
    ((torch.zeros(1, 1, 2, dtype=torch.int64),), {}),                      # 3-D ids
    ((IDS,), {"start_pos": -1}),
    ((IDS,), {"start_pos": 1.5}),
    ((IDS,), {"start_pos": 10}),                                           # learned: 10 + 7 > 16 positions
    ((IDS, torch.arange(7)), {"start_pos": 3}),                            # start_pos would be ignored
]


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "plain"])
@pytest.mark.parametrize("positional, kw", [("learned", {}), ("sinusoidal", {}), ("rope", {"num_heads": 3}),
                                           ("learned", {"position_ids": "padding", "padding_idx": 0})],
                         ids=["learned", "sinusoidal", "rope", "roberta"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("pos", [torch.tensor([4, 0, 15, 2, 2, 9, 1]),
                                 torch.tensor([[0, 1, 2, 3, 4, 5, 6], [15, 14, 3, 3, 0, 1, 2]])], ids=["L", "BL"])
def test_start_pos_with_positions_is_refused_and_changes_nothing(kernels, positional, kw, dropout, pos) -> None:
    """Given positions are used as they are: a nonzero start_pos would be ignored, so it is a
    ConfigError, raised before a dropout seed is drawn from the layer's generator; start_pos=0 (any
    integer type) is the call without it."""
    def fresh() -> tpt.TransformerEmbedding:                                # training mode: dropout active
        return tpt.TransformerEmbedding(50, 12, 16, positional=positional, dropout=dropout,
                                        generator=torch.Generator().manual_seed(7), **kw)

    with tokenpos.use_kernels(kernels):
        layer = fresh()
        with pytest.raises(ConfigError) as err:
            layer(IDS, pos, start_pos=3)
        assert "start_pos=3 given with positions" in str(err.value)
        first = fresh()(IDS, pos)
        assert torch.equal(layer(IDS, pos), first)                           # the generator did not move
        for zero in (0, np.int64(0)):
            assert torch.equal(fresh()(IDS, pos, start_pos=zero), first)


@pytest.mark.parametrize("args, kwargs", BAD_CALLS)
def test_errors_and_rng_untouched_on_both_paths(args, kwargs) -> None:
    """A failed call leaves the generator as it was (every check but the ids' runs before the dropout
    seed is drawn; the op that checks the ids takes the draw back), with the same error on both paths."""
    errors = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, seed=0)
        state = torch.get_rng_state()
        with pytest.raises(ValueError) as err:
            emb(*args, **kwargs)
        assert torch.equal(torch.get_rng_state(), state)
        errors.append((type(err.value), str(err.value)))
    tokenpos.set_kernels(True)
    assert errors[0] == errors[1]


@pytest.mark.parametrize("ids", [IDS.to(torch.int32), IDS.to(torch.uint8), IDS.numpy(), IDS.tolist(), IDS.t()])
def test_other_id_types_and_layouts(kernel_calls, ids) -> None:
    outs = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        emb = tpt.TransformerEmbedding(50, 8, 16, scale=True, seed=0)
        outs.append(emb(ids, start_pos=3))
    assert kernel_calls["forward"] == 1 and torch.equal(*outs)


# ----------------------------------------------------------------------------------------------
# positional schemes are objects
# ----------------------------------------------------------------------------------------------


def test_scheme_objects_carry_their_settings() -> None:
    t5 = tpt.T5RelativePositionBias(4, num_buckets=8, max_distance=20, bidirectional=False, seed=0)
    emb = tpt.TransformerEmbedding(50, 8, 16, positional=t5, seed=0)
    assert emb.position is t5 and emb.positional == "t5" and "position.weight" in emb.state_dict()
    sin = tpt.SinusoidalPositionalEncoding(16, 8, layout="half", base=500.0)
    emb = tpt.TransformerEmbedding(50, 8, 16, positional=sin, seed=0)
    assert torch.equal(emb(IDS), emb.token(IDS) + sin(7))
    for name in ("learned", "sinusoidal", "rope", "alibi", "t5", "none"):
        scheme = tpt.TransformerEmbedding(50, 8, 16, positional=name, num_heads=2, seed=0).position
        assert getattr(type(scheme), "name", "rope") == name                 # rope: its name comes with rotary.py
    emb.reset_parameters(seed=1)                                        # every scheme takes rng=


def test_flattened_scheme_arguments_are_gone() -> None:
    params = inspect.signature(tpt.TransformerEmbedding.__init__).parameters
    for gone in ("base", "sinusoidal_layout", "head_dim", "rope_scaling", "rope_interleaved", "rotary_dim",
                 "t5_num_buckets", "t5_max_distance", "t5_bidirectional"):
        assert gone not in params


def test_wrong_scheme_objects_are_config_errors() -> None:
    with pytest.raises(tpt.ConfigError, match="numpy"):
        tpt.TransformerEmbedding(50, 8, 16, positional=tpn.LearnedPositionalEmbedding(16, 8, seed=0))
    with pytest.raises(tpt.ConfigError, match="torch"):
        tpn.TransformerEmbedding(50, 8, 16, positional=tpt.ALiBi(2))
    with pytest.raises(tpt.ConfigError, match="d_model"):
        tpt.TransformerEmbedding(50, 8, 16, positional=tpt.LearnedPositionalEmbedding(16, 6, seed=0))
    with pytest.raises(tpt.ConfigError):
        tpt.TransformerEmbedding(50, 8, 16, positional=torch.nn.Linear(2, 2))
    with pytest.raises(tpt.ConfigError, match="num_heads"):
        tpt.TransformerEmbedding(50, 8, 16, positional="rope", num_heads=0)


# ----------------------------------------------------------------------------------------------
# autograd: double backward, torch.func
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", [True, False])
def test_double_backward(kernels: bool) -> None:
    tokenpos.set_kernels(kernels)
    try:
        emb = tpt.TransformerEmbedding(50, 6, 16, dropout=0.25, dtype=torch.float64, seed=0)
        torch.manual_seed(0)
        out = emb(IDS)
        params = (emb.token.weight, emb.position.weight)
        grads = torch.autograd.grad(out.pow(3).sum(), params, create_graph=True)
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in grads), params)
        assert all(s.abs().sum() > 0 for s in second)
    finally:
        tokenpos.set_kernels(True)


@pytest.mark.parametrize("kernels", [True, False])
def test_vmap_and_per_sample_gradients(kernels: bool) -> None:
    tokenpos.set_kernels(kernels)
    try:
        emb = tpt.TransformerEmbedding(50, 6, 16, scale=True, padding_idx=0, seed=0)
        batch = torch.stack([IDS, IDS.flip(1), IDS % 7])                      # (3, 2, 7)
        assert torch.equal(torch.vmap(emb)(batch), torch.stack([emb(b) for b in batch]))
        params = {k: v.detach() for k, v in emb.named_parameters()}

        def loss(p, ids):
            return torch.func.functional_call(emb, p, (ids,)).pow(2).sum()

        per = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, batch)
        for i, ids in enumerate(batch):
            emb.zero_grad()
            loss(dict(emb.named_parameters()), ids).backward()
            for name, p in emb.named_parameters():
                close(per[name][i], p.grad, msg=name)
    finally:
        tokenpos.set_kernels(True)


# ----------------------------------------------------------------------------------------------
# threads and aliasing
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", [True, False])
def test_threads_calling_one_layer_get_the_serial_outputs(kernels: bool) -> None:
    tokenpos.set_kernels(kernels)
    try:
        emb = tpt.TransformerEmbedding(500, 64, 128, positional="sinusoidal", scale=True, seed=0).eval()
        gen = torch.Generator().manual_seed(0)
        calls = [(torch.randint(0, 500, (int(b), int(L)), generator=gen), int(s))
                 for b, L, s in torch.randint(1, 40, (24, 3), generator=gen)]
        serial = [emb(ids, start_pos=s) for ids, s in calls]
        results: dict[int, torch.Tensor] = {}

        def worker(k: int) -> None:
            for i in range(k, len(calls), 4):
                results[i] = emb(calls[i][0], start_pos=calls[i][1])

        run_threads(worker)
        assert all(torch.equal(results[i], serial[i]) for i in range(len(calls)))
    finally:
        tokenpos.set_kernels(True)


@pytest.mark.parametrize("kernels", [True, False])
def test_an_output_kept_alive_never_changes_under_a_later_call(kernels: bool) -> None:
    tokenpos.set_kernels(kernels)
    try:
        emb = tpt.TransformerEmbedding(5000, 64, 4096, seed=0).eval()        # 16 MiB outputs
        emb.requires_grad_(False)
        ids = torch.randint(0, 5000, (16, 4096), generator=torch.Generator().manual_seed(0))
        first = emb(ids)
        view, array, dl = first[1:3], first.numpy(), torch.from_dlpack(first)
        copies = [view.clone(), array.copy(), dl.clone()]
        del first
        for _ in range(3):
            emb(ids.flip(0))                                                 # same size, other values
        for kept, copy in zip((view, torch.from_numpy(array), dl), copies, strict=True):
            assert torch.equal(kept, torch.as_tensor(copy))
    finally:
        tokenpos.set_kernels(True)


# ----------------------------------------------------------------------------------------------
# the path from forward to the kernel
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grad", [True, False])
def test_the_stack_from_forward_to_the_kernel_is_the_documented_chain(monkeypatch, grad: bool) -> None:
    """The chain written in docs/DESIGN.md ("One boundary, one plan"): forward -> embed -> (the
    autograd Function's forward, with autograd) -> forward_impl -> forward_rows, which calls the
    compiled core."""
    kernel = importlib.import_module("tokenpos.kernels.embedding")
    emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.1, seed=0)
    with torch.set_grad_enabled(grad):                               # whichever core the output's size takes
        seen = tokenpos_frames_above(monkeypatch, kernel, ("forward_core", "forward_core_serial"), lambda: emb(IDS))
    want = ["embedding.py:forward_rows", "embedding.py:forward_impl",
            *(["entry.py:forward"] if grad else []), "entry.py:embed", "transformer.py:forward"]
    assert seen == [want]


def test_a_call_under_a_default_device_does_not_poison_the_shared_positions():
    """The default positions are cached per (start, length); one built while another default device
    is active (``with torch.device("meta")``) must still be a CPU tensor for every later CPU call."""
    emb = tpt.TransformerEmbedding(50, 16, 32, seed=0).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.device("meta"):
        inside = emb(ids)
    assert inside.device.type == "cpu"
    torch.testing.assert_close(emb(ids), inside, rtol=0, atol=0)


@pytest.mark.parametrize("kernels", [True, False])
def test_shared_tensors_written_through_saved_tensors_do_not_change_later_calls(kernels: bool):
    """The default positions and the no-dropout seed are shared CPU tensors, and a graph saves them
    for backward, where ``grad_fn.saved_tensors`` hands them out. Written in place there, they are
    replaced before the next call reads them, and the written graph's backward refuses to run."""
    emb = tpt.TransformerEmbedding(50, 16, 32, positional="learned", seed=0)
    ids = torch.randint(0, 50, (2, 7))
    with tokenpos.use_kernels(kernels):
        want = emb(ids).detach().clone()
        out = emb(ids)
        small = [t for t in out.grad_fn.saved_tensors if t.dim() <= 1]   # the positions (7,), the seed ()
        assert [tuple(t.shape) for t in small] == [(7,), ()]
        for t in small:
            t.add_(3)                                                      # int64, in place
        torch.testing.assert_close(emb(ids), want, rtol=0, atol=0)       # positions 0..6, no dropout
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
        emb(ids).sum().backward()                                          # a fresh graph trains


@pytest.mark.slow  # a fresh interpreter
def test_importing_under_inference_mode_leaves_training_working():
    """Module-level tensors (the shared no-dropout seed) must not be inference tensors even when
    tokenpos.torch is first imported inside ``torch.inference_mode()``: autograd saves them."""
    script = (
        "import torch\n"
        "with torch.inference_mode():\n"
        "    import tokenpos.torch as tpt\n"
        "emb = tpt.TransformerEmbedding(50, 16, 32, seed=0)\n"
        "emb(torch.randint(0, 50, (2, 7))).sum().backward()\n"
        "assert emb.token.weight.grad is not None\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "plain"])
@pytest.mark.parametrize("config", [
    {},
    {"positional": "sinusoidal"},
    {"positional": "sinusoidal", "padding_idx": 1, "position_ids": "padding"},
    {"positional": "sinusoidal", "padding_idx": 1, "position_ids": "padding", "max_seq_len": 5},
], ids=["learned", "sinusoidal", "sinusoidal, RoBERTa positions", "sinusoidal, RoBERTa positions past the table"])
def test_vmap_over_ids_and_per_sample_grads_equal_eager(config, kernels):
    """torch.func.vmap cannot read the positions' values, so the layer must know from its own
    bound whether RoBERTa positions stay inside a sinusoidal table (and the table must give the
    same bits as its formula when they do not)."""
    kw = {"max_seq_len": 64, **config}
    m = tpt.TransformerEmbedding(10, 8, kw.pop("max_seq_len"), seed=0, **kw).eval()
    ids = torch.tensor([[2, 3, 4, 1], [5, 6, 1, 1]])
    with tokenpos.use_kernels(kernels):
        ref = m(ids)
        torch.testing.assert_close(torch.func.vmap(m)(ids), ref, rtol=0, atol=0)
        params = {k: v.detach() for k, v in m.named_parameters()}

        def loss(p, i):
            return torch.func.functional_call(m, p, (i,)).pow(2).sum()

        per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, ids)
        for k, g in per_sample.items():
            for i in range(ids.shape[0]):
                torch.testing.assert_close(g[i], torch.func.grad(loss)(params, ids[i])[k])


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "plain"])
def test_a_bad_id_inside_torch_func_grad_raises_the_shared_error(kernels):
    emb = tpt.TransformerEmbedding(10, 8, 16, seed=0).eval()
    params = dict(emb.named_parameters())
    bad = torch.tensor([[2, -1, 4]])
    with tokenpos.use_kernels(kernels), pytest.raises(TokenIdError, match="token id -1 at index"):
        torch.func.grad(lambda p: torch.func.functional_call(emb, p, (bad,)).sum())(params)


def test_the_path_of_ids_written_in_design_names_functions_where_they_are() -> None:
    """docs/DESIGN.md ("One boundary, one plan") lists every function the ids pass through, by file:
    each one is defined in the file it names, so the written chain cannot drift from the code."""
    import ast
    import re

    root = Path(tokenpos.__file__).resolve().parent
    design = (root.parents[1] / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    block = design.split("The path of `ids` from the torch layer", 1)[1].split("```")[1]
    rows = re.findall(r"^\s*(\d+)?\s+(\w+/[\w/]+?)(?:\.py)?\s+([\w.]+)(?: / ([\w.]+))?\s", block, re.M)
    numbers = [int(n) for n, *_ in rows if n]
    assert numbers == list(range(1, 17)), numbers
    for _, path, *names in rows:
        file = root / f"{path}.py"
        tree = ast.parse(file.read_text(encoding="utf-8"))
        defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        for name in filter(None, names):
            assert name.split(".")[-1] in defined, (path, name)
