"""A build of llama.cpp made on a device goes back and comes again (scripts/gpu_check).

The CUDA build takes about 250 s of the 15 minutes a GPU machine is lent for. A device run
sends its build back under $OUT in parts the device tool returns (at most 16 MiB each); the
preparation joins them and carries the build while the source is the same; the next run
unpacks it instead of building, where the GPU's architecture matches and the CPU has the flags
of the machine that built it (llama.cpp's CPU backend is built for its builder's CPU).

Tests import nothing from scripts/ (the import contracts): each step runs the check's own
functions in a child python, which prints what the test asserts on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.repo_python import run_python

SHA = "ab" * 32
NAME = f"build-{SHA[:12]}-90-real.tar.xz"

SETUP = f"""
import json, sys
from pathlib import Path
from scripts.gpu_check import prepare
from scripts.gpu_check.__main__ import CPU_FLAGS, GPU, Check, PhaseResult, cpu_flags
import scripts.gpu_check.__main__ as gpu_check
tmp = Path(sys.argv[1])
carry = tmp / "carry"
carry.mkdir(exist_ok=True)
(carry / "manifest.json").write_text(json.dumps({{"archive_sha256": "{SHA}"}}))
prepare.BUILDS = tmp / "builds"
def device_check(folder):
    return Check(GPU, tmp / folder / "out", 60, cuda_arch="90-real", carry=carry,
                 work=tmp / folder / "work")
"""

ROUND_TRIP = """
first = device_check("first")
payload = bytes.fromhex(sys.argv[2])
(first.build_dir / "bin").mkdir(parents=True)
(first.build_dir / "bin" / "libggml-cuda.so.0").write_bytes(payload)
(first.build_dir / "bin" / "libggml-cuda.so").symlink_to("libggml-cuda.so.0")
gpu_check.BUILD_PART_BYTES = 4 * 1024
first.pack_build()
report = {"packed": first.build_packed,
          "parts": sorted(p.name for p in first.out.glob("build-*"))}
report["carried"] = prepare.carry_builds(carry, SHA, [first.out])
report["carried_other_source"] = prepare.carry_builds(carry, "cd" * 32, [])
report["carried_from_store"] = prepare.carry_builds(carry, SHA, [])
second = device_check("second")
result = PhaseResult("setup")
second.use_carried_build(json.loads((carry / "manifest.json").read_text()), result)
library = second.build_dir / "bin" / "libggml-cuda.so"
report.update(prebuilt=second.prebuilt, detail=result.detail, symlink=library.is_symlink(),
              same=library.is_file() and library.read_bytes() == payload,
              has_flags=bool(cpu_flags()))
print("REPORT=" + json.dumps(report))
""".replace("SHA", repr(SHA))

OTHER_CPU = """
import io, tarfile
buffer = io.BytesIO()
with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
    flags = b"avx2 no_such_cpu_flag\\n"
    member = tarfile.TarInfo(CPU_FLAGS)
    member.size = len(flags)
    archive.addfile(member, io.BytesIO(flags))
(carry / sys.argv[2]).write_bytes(buffer.getvalue())
check = device_check("other")
result = PhaseResult("setup")
check.use_carried_build(json.loads((carry / "manifest.json").read_text()), result)
print("REPORT=" + json.dumps({"prebuilt": check.prebuilt, "detail": result.detail,
                              "unpacked": (check.build_dir / "bin").exists()}))
"""


def run(code: str, *args: str) -> dict[str, Any]:
    done = run_python(["-c", SETUP + code, *args], timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("REPORT="))
    report: dict[str, Any] = json.loads(line.removeprefix("REPORT="))
    return report


def test_a_build_sent_back_in_parts_is_joined_carried_and_used(tmp_path: Path) -> None:
    payload = os.urandom(20 * 1024)  # incompressible: five parts of 4 KiB and a little more
    report = run(ROUND_TRIP, str(tmp_path), payload.hex())
    if not report["has_flags"]:
        pytest.skip("no /proc/cpuinfo: a carried build is never used")
    assert report["packed"]["name"] == NAME
    assert len(report["parts"]) == report["packed"]["parts"] >= 4
    assert report["parts"][0] == f"{NAME}.part0"
    assert report["carried"] == [NAME]
    assert report["carried_other_source"] == []  # another source: not carried
    assert report["carried_from_store"] == [NAME]  # kept in the store since
    assert sorted(p.name for p in (tmp_path / "builds").iterdir()) == [NAME]  # the test's own
    assert report["prebuilt"], report["detail"]
    assert report["detail"]["build"] == f"carried: {NAME}"
    assert report["symlink"]
    assert report["same"]


def test_a_build_for_a_cpu_with_other_flags_is_not_used(tmp_path: Path) -> None:
    report = run(OTHER_CPU, str(tmp_path), NAME)
    assert not report["prebuilt"]
    assert "no_such_cpu_flag" in report["detail"]["build"]
    assert not report["unpacked"]


LINKAGE = """
import sys
from pathlib import Path
from scripts.gpu_check.__main__ import libstdcxx_linkage
print(libstdcxx_linkage(Path(sys.argv[1])))
"""


@pytest.mark.skipif(
    not (shutil.which("c++") and shutil.which("readelf")), reason="no C++ compiler or readelf"
)
@pytest.mark.parametrize(("flags", "expected"), [([], "shared"), (["-static-libstdc++"], "static")])
def test_the_report_says_how_libllama_has_libstdcxx(
    tmp_path: Path, flags: list[str], expected: str
) -> None:
    """A libllama with its own static libstdc++ must load before numpy (docs/gpu.md, "The
    load-order crash"): the report says which kind the build is."""
    source = tmp_path / "vocab.cc"
    source.write_text(
        "#include <regex>\n#include <string>\n"
        'bool split(const std::string& s) { return std::regex_match(s, std::regex("[a-z]+")); }\n'
    )
    subprocess.run(
        ["c++", "-shared", "-fPIC", *flags, str(source), "-o", str(tmp_path / "libllama.so.0")],
        check=True, timeout=120,
    )  # fmt: skip
    done = run_python(["-c", LINKAGE, str(tmp_path)], timeout=60)
    assert done.stdout.strip() == expected, done.stderr
    empty = run_python(["-c", LINKAGE, str(tmp_path / "none")], timeout=60)
    assert empty.stdout.strip() == "None"
