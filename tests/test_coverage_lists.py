"""Every public layer is in every guard table that must hold it.

The public layers are derived, never listed: every scheme class of ``tables.registry`` and every layer class of
``tokenpos.numpy`` / ``tokenpos.torch`` ``__all__`` (``tests/public_layers.py``). The tables are:

- ``LAYERS`` of ``tests/torch/test_compile_dynamic.py`` (every torch layer compiles whole, dynamic shapes),
- ``CASES`` of ``tests/torch/test_no_host_sync.py`` (every torch layer runs on CUDA without a host sync),
- ``CASES`` of ``tests/numpy/test_backward_gradients.py`` (every NumPy layer with a backward checks its gradient),
- ``CASES`` of ``tests/parity/test_rotary_mixed_dtypes.py`` and ``KWARGS`` of
  ``tests/parity/test_rotary_start_pos_overflow.py`` (every rotary layer of both backends),
- ``SPECS`` of ``tests/numpy/layers.py`` (the NumPy guards: kept inputs, tied parameters, checkpoint dtypes),
- the ``TransformerEmbedding`` shortcuts of the compile and no-host-sync tests (every registered shortcut).

Each table takes its scheme cases from the registry, so for a registered scheme this checks the derivation; a
layer that is not a scheme (a new norm, a new embedding) needs its hand-written case, and its absence fails
here naming the table.
"""

from __future__ import annotations

import pytest

from tests.numpy import layers as numpy_layers
from tests.numpy import test_backward_gradients as backward_gradients
from tests.public_layers import covered, public_layers
from tokenpos.tables.registry import SCHEMES, SHORTCUTS, scheme_class

pytest.importorskip("torch")

from tests.parity import test_rotary_mixed_dtypes as mixed_dtypes  # noqa: E402
from tests.parity import test_rotary_start_pos_overflow as start_pos_overflow  # noqa: E402
from tests.torch import test_compile as compile_static  # noqa: E402
from tests.torch import test_compile_dynamic as compile_dynamic  # noqa: E402
from tests.torch import test_no_host_sync as no_host_sync  # noqa: E402


def _rotary(backend: str) -> set[str]:
    return {n for n, cls in public_layers(backend).items() if getattr(cls, "kind", None) == "rotary"}


def test_the_public_layers_are_found() -> None:
    """The discovery finds the layers it must (so an empty derivation cannot pass the checks below)."""
    for backend in ("numpy", "torch"):
        layers = public_layers(backend)
        assert {"TokenEmbedding", "TransformerEmbedding", "LayerNorm", "RMSNorm"} <= set(layers), backend
        assert {scheme_class(n, backend).__name__ for n in SCHEMES} <= set(layers), backend
    assert len(_rotary("numpy")) >= 4 and _rotary("numpy") == _rotary("torch")


def test_every_public_torch_layer_compiles_in_test_compile_dynamic() -> None:
    names = set(public_layers("torch"))
    missing = names - covered(compile_dynamic.LAYERS, {n: n for n in names})
    assert not missing, f"public torch layers without a case (named '<Class>' or '<Class>_<variant>') in LAYERS of " \
                        f"tests/torch/test_compile_dynamic.py: {sorted(missing)}"


def test_every_public_torch_layer_runs_in_test_no_host_sync() -> None:
    prefixes = {**{name: scheme_class(name, "torch").__name__ for name in SCHEMES},
                **{prefix: cls for cls, prefix in no_host_sync.LAYER_CASES.items()}}
    missing = set(public_layers("torch")) - covered(no_host_sync.CASES, prefixes)
    assert not missing, f"public torch layers without a case in CASES of tests/torch/test_no_host_sync.py (a layer " \
                        f"that is not a scheme also needs its case-name prefix in LAYER_CASES): {sorted(missing)}"


def test_every_registered_shortcut_is_a_transformer_case_of_the_compile_and_no_host_sync_tests() -> None:
    for table, keys, pattern in (
            ("LAYERS of tests/torch/test_compile_dynamic.py", compile_dynamic.LAYERS, "TransformerEmbedding_{}"),
            ("CASES of tests/torch/test_no_host_sync.py", no_host_sync.CASES, "transformer_{}_default")):
        missing = [name for name in SHORTCUTS if pattern.format(name) not in keys]
        assert not missing, f"shortcuts without a TransformerEmbedding case in {table}: {missing}"
    marks = [m for m in getattr(compile_static.test_fused_op_stays_in_the_graph, "pytestmark", [])
             if m.name == "parametrize"]
    positionals = next(m.args[1] for m in marks if m.args[0] == "positional")
    assert list(positionals) == list(SHORTCUTS), "tests/torch/test_compile.py::test_fused_op_stays_in_the_graph " \
                                                 "takes every registered shortcut"


def test_every_numpy_layer_with_a_backward_checks_its_gradient() -> None:
    with_backward = {n for n, cls in public_layers("numpy").items() if hasattr(cls, "backward")}
    done = {name.split(".")[0] for name in backward_gradients.CASES} | backward_gradients.NOTHING_TO_COMPUTE
    missing = with_backward - done
    assert not missing, f"NumPy layers with a backward missing from CASES (or NOTHING_TO_COMPUTE, with the reason) " \
                        f"of tests/numpy/test_backward_gradients.py: {sorted(missing)}"


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_every_rotary_layer_has_a_mixed_dtype_case_and_start_pos_arguments(backend: str) -> None:
    rotary = _rotary(backend)
    cases = {cls for cls, _, _ in mixed_dtypes.CASES.values()}
    assert rotary <= cases, f"rotary layers without a case in CASES of tests/parity/test_rotary_mixed_dtypes.py: " \
                            f"{sorted(rotary - cases)}"
    assert rotary <= set(start_pos_overflow.KWARGS), \
        f"rotary layers without arguments in KWARGS of tests/parity/test_rotary_start_pos_overflow.py: " \
        f"{sorted(rotary - set(start_pos_overflow.KWARGS))}"


def test_every_public_numpy_layer_has_specs() -> None:
    missing = set(public_layers("numpy")) - set(numpy_layers.SPECS)
    assert not missing, f"NumPy layers without an entry in HAND_SPECS of tests/numpy/layers.py: {sorted(missing)}"
