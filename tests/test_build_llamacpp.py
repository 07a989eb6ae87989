"""The llama.cpp build flags follow the CPU's features: never an instruction the CPU lacks, never AMX."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_llamacpp.sh"
AVX2_ONLY = "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 popcnt avx f16c bmi1 avx2 bmi2"
INTEL_AMX = AVX2_ONLY + (" avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16 avx_vnni"
                         " amx_bf16 amx_tile amx_int8")


def flags(tmp_path: Path, cpu: str) -> dict[str, str]:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {cpu}\n")
    out = subprocess.run(["bash", str(SCRIPT), "--flags"], env={"CPUINFO": str(info), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout.split()
    return dict(f.removeprefix("-D").split("=", 1) for f in out)


def test_avx2_cpu_gets_no_avx512(tmp_path):
    f = flags(tmp_path, AVX2_ONLY)
    assert f["GGML_NATIVE"] == "OFF" and f["GGML_AVX2"] == "ON" and f["GGML_FMA"] == "ON"
    assert all(f[k] == "OFF" for k in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
                                       "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"))


def test_intel_cpu_gets_avx512_but_never_amx(tmp_path):
    f = flags(tmp_path, INTEL_AMX)
    assert f["GGML_AVX512"] == f["GGML_AVX512_VNNI"] == f["GGML_AVX512_BF16"] == f["GGML_AVX_VNNI"] == "ON"
    assert f["GGML_AMX_TILE"] == f["GGML_AMX_INT8"] == f["GGML_AMX_BF16"] == "OFF"


@pytest.mark.parametrize("missing", ["avx512bw", "avx512vl"])
def test_partial_avx512_is_not_enough(tmp_path, missing):
    f = flags(tmp_path, INTEL_AMX.replace(f" {missing}", ""))
    assert f["GGML_AVX512"] == "OFF" and f["GGML_AVX512_VNNI"] == "OFF"
