"""Where a model runs: the llama.cpp build's report, the AMX protection, GPU options.

The decisions are pure (``plan_placement`` over a ``BuildInfo``), so they are tested for
builds this machine does not have (AMX kernels, CUDA); what reaches llama.cpp is checked by
recording ``llama_model_params`` at the real load.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from chatkit import BuildInfo, Device, InvalidParameter, Model, SeqChunk, build_info
from chatkit.engine import backends
from chatkit.engine.backends import (
    INVARIANT_V_TYPE,
    SPLIT_MODES,
    TILED_MM_ENV,
    batch_invariant_kernels,
    parse_system_info,
    plan_placement,
)
from chatkit.engine.lowlevel import llama_cpp
from tests.conftest import in_fresh_process

CPU_ONLY = BuildInfo(features={"CPU": {"AVX2": "1", "AVX512": "1"}}, devices=(
    Device("CPU", "Intel Xeon", "cpu", 0, 0),), gpu_offload=False, max_devices=16)
AMX = BuildInfo(features={"CPU": {"AVX512": "1", "AMX_INT8": "1"}}, devices=(
    Device("CPU", "Intel Xeon", "cpu", 0, 0),), gpu_offload=False, max_devices=16)
CUDA = BuildInfo(features={"CPU": {"AVX2": "1"}, "CUDA": {"ARCHS": "900"}}, devices=(
    Device("CUDA0", "NVIDIA H200", "gpu", 140 << 30, 141 << 30),
    Device("CPU", "AMD EPYC", "cpu", 0, 0)), gpu_offload=True, max_devices=16)

DEFAULTS: dict[str, Any] = {"n_gpu_layers": None, "main_gpu": 0, "split_mode": "layer",
                            "tensor_split": None, "flash_attn": None, "offload_kqv": True,
                            "extra_buffer_types": None}


def plan(info: BuildInfo, **kw: Any) -> Any:
    return plan_placement(info, **{**DEFAULTS, **kw})


def test_system_info_is_parsed_per_backend() -> None:
    text = ("CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 | "
            "CUDA : ARCHS = 900 | USE_GRAPHS = 1 | ")
    parsed = parse_system_info(text)
    assert parsed["CPU"]["AMX_INT8"] == "1" and parsed["CPU"]["REPACK"] == "1"
    assert parsed["CUDA"] == {"ARCHS": "900", "USE_GRAPHS": "1"}
    assert BuildInfo(parsed, (), False, 16).amx_kernels
    assert not BuildInfo(parse_system_info("CPU : AVX2 = 1 | "), (), False, 16).amx_kernels


def test_this_build_is_read_from_llama_cpp() -> None:
    info = build_info()
    assert info.features.get("CPU")
    assert info.gpu_offload == bool(llama_cpp.llama_supports_gpu_offload())
    assert any(d.kind == "cpu" for d in info.devices)
    assert info.describe()[0].startswith("gpu offload:")


def test_amx_build_turns_extra_buffer_types_off() -> None:
    placed = plan(AMX)
    assert placed.extra_buffer_types is False and "AMX" in placed.reason
    assert plan(CPU_ONLY).extra_buffer_types is True
    # the caller's word wins, both ways (a llama.cpp with the upstream fix)
    assert plan(AMX, extra_buffer_types=True).extra_buffer_types is True
    assert plan(CPU_ONLY, extra_buffer_types=False).extra_buffer_types is False


def test_batch_invariant_repacks_no_weights() -> None:
    for info in (CPU_ONLY, AMX):
        placed = plan(info, batch_invariant=True)
        assert placed.batch_invariant and placed.extra_buffer_types is False
        assert "tiled K-quant matmul off" in placed.reason and "Q8_0 V cache" in placed.reason
        assert placed.flash_attn is True  # the one attention kernel for every step's shape
    assert plan(CPU_ONLY, batch_invariant=True, extra_buffer_types=False).batch_invariant
    assert plan(CPU_ONLY, batch_invariant=True, flash_attn=True).flash_attn is True
    with pytest.raises(InvalidParameter) as err:
        plan(CPU_ONLY, batch_invariant=True, flash_attn=False)
    assert err.value.name == "flash_attn"
    assert not plan(CPU_ONLY).batch_invariant
    with pytest.raises(InvalidParameter) as err:
        plan(CPU_ONLY, batch_invariant=True, extra_buffer_types=True)
    assert err.value.name == "extra_buffer_types"
    with pytest.raises(InvalidParameter) as err:
        plan(CPU_ONLY, batch_invariant=1)
    assert err.value.name == "batch_invariant"


@pytest.fixture
def tiled_switch(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """``GGML_CPU_TILED_MM`` unset and no model loaded yet, both restored afterwards."""
    monkeypatch.setenv(TILED_MM_ENV, "restored")
    monkeypatch.delenv(TILED_MM_ENV)
    monkeypatch.setattr(backends, "_tiled_seen_on", False)
    return monkeypatch


def test_batch_invariant_turns_the_tiled_matmul_off_for_the_process(
        tiled_switch: pytest.MonkeyPatch) -> None:
    batch_invariant_kernels(True)
    assert os.environ[TILED_MM_ENV] == "0"
    batch_invariant_kernels(False)  # a later model runs with it off too
    batch_invariant_kernels(True)
    assert os.environ[TILED_MM_ENV] == "0"
    for value in (" 00", "4294967296"):  # read as glibc's atoi reads it: 0
        tiled_switch.setenv(TILED_MM_ENV, value)
        batch_invariant_kernels(True)
        assert os.environ[TILED_MM_ENV] == value


def test_batch_invariant_is_refused_once_the_tiled_matmul_may_have_run(
        tiled_switch: pytest.MonkeyPatch) -> None:
    batch_invariant_kernels(False)  # a model loaded with llama.cpp's default
    with pytest.raises(InvalidParameter, match="load the batch-invariant model first") as err:
        batch_invariant_kernels(True)
    assert err.value.name == "batch_invariant" and TILED_MM_ENV not in os.environ
    tiled_switch.setenv(TILED_MM_ENV, "0")  # too late: llama.cpp may have read it
    with pytest.raises(InvalidParameter, match="load the batch-invariant model first"):
        batch_invariant_kernels(True)
    tiled_switch.setattr(backends, "_tiled_seen_on", False)
    for value in ("1", "2x"):
        tiled_switch.setenv(TILED_MM_ENV, value)
        with pytest.raises(InvalidParameter, match=f"{TILED_MM_ENV}='{value}'"):
            batch_invariant_kernels(True)
        assert os.environ[TILED_MM_ENV] == value


def test_batch_invariant_reaches_llama_cpp(tiled_switch: pytest.MonkeyPatch) -> None:
    seen = _Recorder(tiled_switch)
    model = Model.load(n_ctx=512, n_seq_max=1, batch_invariant=True)
    try:
        assert seen.model[-1]["use_extra_bufts"] is False
        assert seen.context[-1]["type_v"] == INVARIANT_V_TYPE == llama_cpp.GGML_TYPE_Q8_0
        assert seen.context[-1]["flash_attn_type"] == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        assert model.placement.batch_invariant and os.environ[TILED_MM_ENV] == "0"
    finally:
        model.close()
    tiled_switch.delenv(TILED_MM_ENV)
    tiled_switch.setattr(backends, "_tiled_seen_on", True)
    before = len(seen.model)
    with pytest.raises(InvalidParameter):
        Model.load(n_ctx=512, n_seq_max=1, batch_invariant=True)
    assert len(seen.model) == before  # refused before llama.cpp loads anything


_STEPS_AGREE = """
import sys
from chatkit import Model
model = Model.load(sys.argv[1], n_ctx=1024, n_seq_max=1, batch_invariant=sys.argv[2] == "1")
text = "Rules follow. " + "Run the tests after a change. " * 60
prompt = model.tokenize(text, special=False)[:200]
rows = []
for step in (2, 3, 5, 8, 13, 32):  # 200 leaves a last step of 2 or more rows in each
    model.seq_rm(0)
    rows.append(model.prefill(0, prompt, chunk=step))
print(sum(bool((r == rows[-1]).all()) for r in rows[:-1]))
"""


_LONE_ROW = """
import sys
from chatkit import Model
from chatkit.engine.protocols import SeqChunk
model = Model.load(n_ctx=2 * 1024, n_seq_max=2, batch_invariant=sys.argv[1] == "1")
ours = model.tokenize("Run the tests after a change, and read the diff twice. " * 80,
                      special=False)[:700]
theirs = model.tokenize("Something else entirely, about the weather in Oslo. " * 80,
                        special=False)[:700]
same = 0
for depth in (300, 600):  # a stream's attention over 512 cells or more
    model.seq_rm(0); model.seq_rm(1)
    model.prefill(0, ours[:depth]); model.prefill(1, theirs[:depth])
    alone = model.decode([SeqChunk(0, depth, [ours[depth]], "last")])[0].copy()
    model.seq_rm(0, depth, -1)
    beside = model.decode([SeqChunk(0, depth, [ours[depth]], "last"),
                           SeqChunk(1, depth, [theirs[depth]], "last")])[0]
    same += bool((alone == beside).all())
print(same)
"""


@pytest.mark.bitwise
def test_batch_invariant_a_lone_row_attends_as_it_does_beside_another_sequence() -> None:
    """A decoding row alone in its step (a reply sent alone) has the logits it has beside
    another sequence's row (the same reply among others), however many cells it attends
    to: llama.cpp's flash attention splits a lone row over 512 cells or more across
    threads for an F16 V cache, not for batch_invariant's Q8_0 one. In a fresh process."""
    same, stderr = in_fresh_process(_LONE_ROW, "1")
    assert same == "2", stderr


@pytest.mark.gemma
@pytest.mark.bitwise
def test_batch_invariant_gemma_logits_do_not_depend_on_the_step() -> None:
    """Gemma 3 270M's Q4_K_M carries K-quant weights: with batch_invariant its prompt's
    logits are the same whether it is prefilled 2, 3, 5, 8, 13 or 32 rows at a time. In a
    fresh process: llama.cpp reads its tiled-matmul switch once per process."""
    from tests.conftest import gemma_path

    same, stderr = in_fresh_process(_STEPS_AGREE, str(gemma_path()), "1")
    assert same == "5", stderr


def test_gpu_layers_default_to_every_layer_where_the_build_offloads() -> None:
    on_gpu = plan(CUDA)
    assert on_gpu.n_gpu_layers == -1 and on_gpu.on_gpu and "CUDA0" in on_gpu.reason
    assert plan(CUDA, n_gpu_layers=0).on_gpu is False
    assert plan(CUDA, n_gpu_layers=12).n_gpu_layers == 12
    on_cpu = plan(CPU_ONLY)
    assert on_cpu.n_gpu_layers == 0 and not on_cpu.on_gpu and "no GPU backend" in on_cpu.reason


def test_cpu_only_build_accepts_gpu_layers_and_says_so() -> None:
    placed = plan(CPU_ONLY, n_gpu_layers=99)
    assert placed.n_gpu_layers == 0 and "n_gpu_layers=99 has no effect" in placed.reason


@pytest.mark.parametrize(("name", "value"), [
    ("n_gpu_layers", -2), ("n_gpu_layers", 1.5), ("n_gpu_layers", True), ("n_gpu_layers", "all"),
    ("main_gpu", -1), ("main_gpu", 1), ("main_gpu", "0"),
    ("split_mode", "rows"), ("split_mode", None),
    ("tensor_split", [1.0] * 17), ("tensor_split", []), ("tensor_split", [0, 0]),
    ("tensor_split", [float("nan")]), ("tensor_split", [-1.0, 2.0]), ("tensor_split", "3,1"),
    ("flash_attn", "on"), ("offload_kqv", None), ("extra_buffer_types", 1),
])
def test_bad_placement_options_are_named(name: str, value: Any) -> None:
    with pytest.raises(InvalidParameter) as info:
        plan(CUDA, **{name: value})  # one GPU: main_gpu 1 does not exist
    assert info.value.name == name


def test_cli_split_modes_are_the_models() -> None:
    from chatkit.cli import SPLIT_MODES as CLI_MODES

    assert set(CLI_MODES) == set(SPLIT_MODES)


class _Recorder:
    """Records the ``llama_model_params`` and context params llama.cpp is given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.model: list[dict[str, Any]] = []
        self.context: list[dict[str, Any]] = []
        load, init = llama_cpp.llama_model_load_from_file, llama_cpp.llama_init_from_model

        def recording_load(path: bytes, params: Any) -> Any:
            self.model.append({f: getattr(params, f) for f in (
                "n_gpu_layers", "main_gpu", "split_mode", "use_extra_bufts")})
            return load(path, params)

        def recording_init(model: Any, params: Any) -> Any:
            self.context.append({f: getattr(params, f) for f in (
                "flash_attn_type", "offload_kqv", "type_v")})
            return init(model, params)

        monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", recording_load)
        monkeypatch.setattr(llama_cpp, "llama_init_from_model", recording_init)


def _long_prompt_decodes(model: Model) -> None:
    """A 160-token prompt in ONE llama_decode: the size at which the AMX kernels crashed."""
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog. " * 16, special=False)
    assert len(tokens) >= 100
    rows = model.decode([SeqChunk(0, 0, tokens[:160], "last")])
    assert rows[0].shape == (1, model.n_vocab)


def test_amx_protection_reaches_llama_cpp_and_a_long_prompt_decodes(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import chatkit.engine.model as model_module

    real = build_info()
    pretend = BuildInfo(features={**real.features, "CPU": {**real.features["CPU"],
                                                          "AMX_INT8": "1"}},
                        devices=real.devices, gpu_offload=real.gpu_offload,
                        max_devices=real.max_devices)
    monkeypatch.setattr(model_module, "build_info", lambda: pretend)
    seen = _Recorder(monkeypatch)
    with caplog.at_level(logging.INFO, logger="chatkit"):
        model = Model.load(n_ctx=512, n_seq_max=1)
    try:
        assert seen.model[-1]["use_extra_bufts"] is False
        assert model.placement.extra_buffer_types is False
        assert any("extra buffer types off" in r.getMessage() for r in caplog.records)
        _long_prompt_decodes(model)
    finally:
        model.close()


def test_gpu_options_reach_llama_cpp_on_this_build(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    seen = _Recorder(monkeypatch)
    with caplog.at_level(logging.INFO, logger="chatkit"):
        model = Model.load(n_ctx=512, n_seq_max=1, n_gpu_layers=99, split_mode="none",
                           flash_attn=False, offload_kqv=False, tensor_split=[1.0])
    try:
        params, ctx = seen.model[-1], seen.context[-1]
        assert params["split_mode"] == SPLIT_MODES["none"]
        assert ctx == {"flash_attn_type": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                       "offload_kqv": False, "type_v": llama_cpp.GGML_TYPE_F16}
        if build_info().gpu_offload:
            assert params["n_gpu_layers"] == 99 and model.placement.on_gpu
        else:  # a CPU-only build accepts the option and logs that it runs on the CPU
            assert params["n_gpu_layers"] == 0 and not model.placement.on_gpu
            assert any("on the CPU" in r.getMessage() for r in caplog.records)
        _long_prompt_decodes(model)
    finally:
        model.close()


def test_bad_gpu_option_is_refused_before_llama_cpp_loads(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    seen = _Recorder(monkeypatch)
    with pytest.raises(InvalidParameter):
        Model.load(n_ctx=512, n_seq_max=1, split_mode="diagonal")
    assert seen.model == []


def test_info_shows_backends_and_placement(capsys: pytest.CaptureFixture[str]) -> None:
    from chatkit.cli import main

    assert main(["info", "--n-gpu-layers", "0"]) == 0
    out = capsys.readouterr().out
    assert "placement: on the CPU" in out
    assert "backend CPU:" in out and "device 0:" in out


def test_cli_refuses_a_bad_gpu_option_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from chatkit.cli import main

    code = main(["run", "--prompt", "hi", "--n-gpu-layers", "-3"])
    assert code != 0 and "--n-gpu-layers" in capsys.readouterr().err
