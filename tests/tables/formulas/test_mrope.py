"""tokenpos.tables.formulas.mrope: the frequency -> axis maps of both layouts and the position-id helper's checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tokenpos.tables import ConfigError, DtypeError, PositionError
from tokenpos.tables.formulas.mrope import mrope_axis_map, mrope_position_ids


def test_axis_maps() -> None:
    np.testing.assert_array_equal(mrope_axis_map([2, 3, 3], 8), [0, 0, 1, 1, 1, 2, 2, 2])
    # Qwen3-VL: T H W T H W T H W T ... with h = w = 2 over F = 8
    np.testing.assert_array_equal(mrope_axis_map([4, 2, 2], 8, layout="interleaved"), [0, 1, 2, 0, 1, 2, 0, 0])
    qwen3 = mrope_axis_map([24, 20, 20], 64, layout="interleaved")
    assert np.bincount(qwen3).tolist() == [24, 20, 20]


def test_text_only_rows_count_up() -> None:
    pos, delta = mrope_position_ids(np.zeros((2, 5), dtype=np.int64))
    np.testing.assert_array_equal(pos, np.broadcast_to(np.arange(5), (3, 2, 5)))
    np.testing.assert_array_equal(delta, [[0], [0]])


def test_image_grid_positions() -> None:
    types = np.array([[0, 1, 1, 1, 1, 1, 1, 0]])
    pos, delta = mrope_position_ids(types, np.array([[1, 4, 6]]), spatial_merge_size=2)
    # grid (1, 2, 3) starts at 1: T = 1, H = 1 1 1 2 2 2, W = 1 2 3 1 2 3; then text at 1 + max(4, 6) / 2 = 4
    np.testing.assert_array_equal(pos[:, 0], [[0, 1, 1, 1, 1, 1, 1, 4], [0, 1, 1, 1, 2, 2, 2, 4],
                                              [0, 1, 2, 3, 1, 2, 3, 4]])
    assert delta[0, 0] == 5 - 8


def test_mismatched_runs_and_grids_raise() -> None:
    types = np.array([[0, 1, 1, 1, 0]])
    with pytest.raises(ConfigError, match="does not fit grid"):
        mrope_position_ids(types, np.array([[1, 4, 6]]), spatial_merge_size=2)
    with pytest.raises(ConfigError, match="more image runs than image_grid_thw grids"):
        mrope_position_ids(types)
    with pytest.raises(ConfigError, match="token_types"):
        mrope_position_ids(np.array([[0, 3]]))
    with pytest.raises(ConfigError, match=r"image_grid_thw must be positive ints of shape \(N, 3\)"):
        mrope_position_ids(types, np.array([1, 1, 3]))


@pytest.mark.parametrize("secs", [None, [0.5, 1.3]])
def test_qwen25_vl_temporal_scaling_matches_hf_get_rope_index(secs: list[float] | None) -> None:
    """Qwen2.5-VL spaces the T ids of a video by tokens_per_second * second_per_grid_ts (float32, truncated)."""
    import functools
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    q25 = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
    model = q25.Qwen2_5_VLModel
    vision = SimpleNamespace(spatial_merge_size=2, tokens_per_second=7)
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = functools.partial(model.get_vision_position_ids, fake)
    # row 0: 2 text, video (3, 2, 2) -> 3 tokens, 1 text, image (1, 2, 4) -> 2 tokens, video (2, 2, 4) -> 4, 2 text
    types = torch.tensor([[0, 0] + [2] * 3 + [0] + [1] * 2 + [2] * 4 + [0, 0]])
    ids = torch.arange(types.numel()).reshape(types.shape)
    image, video = torch.tensor([[1, 2, 4]]), torch.tensor([[3, 2, 2], [2, 2, 4]])
    sec_t = None if secs is None else torch.tensor(secs)
    want, want_delta = model.get_rope_index(fake, ids, types, image_grid_thw=image, video_grid_thw=video,
                                            second_per_grid_ts=sec_t)
    got, delta = mrope_position_ids(types.numpy(), image.numpy(), video.numpy(), spatial_merge_size=2,
                                    tokens_per_second=7, second_per_grid_ts=secs)
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(delta, want_delta.numpy())
    assert got[0].max() > got[1].max()                       # the T axis was stretched


def test_temporal_scaling_arguments_are_checked() -> None:
    types = np.array([[0] + [2] * 2])
    with pytest.raises(ConfigError, match="tokens_per_second"):
        mrope_position_ids(types, video_grid_thw=[[2, 1, 1]], second_per_grid_ts=[1.0])
    with pytest.raises(ConfigError, match="second_per_grid_ts"):
        mrope_position_ids(types, video_grid_thw=[[2, 1, 1]], tokens_per_second=2, second_per_grid_ts=[])
    with pytest.raises(ConfigError, match="split_video_frames"):
        mrope_position_ids(types, video_grid_thw=[[2, 1, 1]], tokens_per_second=2, split_video_frames=True)


def test_a_packed_row_counts_every_sample_from_zero() -> None:
    # sample 0: text, image (1, 2, 4) / 2 -> 2 tokens, text; sample 1: text only; sample 2: image (1, 2, 2) -> 1
    types = np.array([0, 1, 1, 0, 0, 0, 1])
    pos, delta = mrope_position_ids(types, np.array([[1, 2, 4], [1, 2, 2]]), spatial_merge_size=2,
                                    cu_seqlens=np.array([0, 4, 6, 7]))
    np.testing.assert_array_equal(pos[:, 0], [[0, 1, 1, 3, 0, 1, 0], [0, 1, 1, 3, 0, 1, 0],
                                              [0, 1, 2, 3, 0, 1, 0]])
    np.testing.assert_array_equal(delta, [[0], [0], [0]])
    one, _ = mrope_position_ids(types[None, :4], np.array([[1, 2, 4]]), spatial_merge_size=2)
    np.testing.assert_array_equal(pos[:, :, :4], one)                  # a sample alone gives the same ids


@pytest.mark.parametrize("types, cu, kwargs, error, text", [
    # an image run that spans two samples: each part is a run of its own, which fits no grid
    ([0, 1, 1, 0], [0, 2, 4], {"image_grid_thw": [[1, 2, 4]]}, ConfigError,
     r"sample 0 \(tokens 0:2\): a run of 1 image tokens at index 1 does not fit grid"),
    ([0, 0, 0], [0, 1, 2], {}, PositionError, r"must end at the number of tokens T = 3, got cu_seqlens\[-1\] = 2"),
    ([0, 0, 0], [1, 3], {}, PositionError, r"cu_seqlens\[0\] must be 0"),
    ([0, 0, 0], np.array([0, 3.0]), {}, DtypeError, "int32 or int64"),
    ([[0, 0], [0, 0]], [0, 2], {}, ConfigError, r"one row: with cu_seqlens expected token_types \(1, T\)"),
    ([0, 0, 0], [0, 3], {"attention_mask": np.ones((1, 3))}, ConfigError, "a packed row has no padding"),
    ([0, 0, 0], [0, 3], {"spatial_merge_size": 0}, ConfigError, "spatial_merge_size must be >= 1, got 0"),  # 1/0
    ([0, 0, 0], [0, 3], {"spatial_merge_size": 2.5}, ConfigError, "spatial_merge_size must be an integer"),  # cut
])
def test_bad_packed_calls_are_refused(types: list, cu: Any, kwargs: dict, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        mrope_position_ids(np.array(types), cu_seqlens=np.asarray(cu), **kwargs)
