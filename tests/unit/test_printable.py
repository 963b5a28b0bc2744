"""Text is data: what users and agents say is escaped wherever the CLI prints it, and
refused (or cleaned) where it enters."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.cli import render
from gpuq.coordinator.nodes.agent_input import check_registration, clean_usage
from gpuq.domain.limits import CONTROL_RE, check_reason, check_text, clean_line
from gpuq.errors import InvalidInput
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

HOSTILE = [
    ("a\x1b]0;pwned\x07b", "a\\x1b]0;pwned\\x07b"),  # OSC: sets the terminal's title
    ("a\x1b[2Jb", "a\\x1b[2Jb"),  # CSI: clears the screen
    ("line\n", "line\\n"),
    ("a\tb\rc", "a\\tb\\rc"),
    ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),  # NUL, DEL, C1 NEL and CSI
    ("evil\u202etxt.sh", "evil\\u202etxt.sh"),  # right-to-left override
    ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
    ("\u2066\u2067\u2068\u2069\u202a\u202b\u202c\u202d", None),
]


@pytest.mark.parametrize(("text", "expected"), HOSTILE)
def test_printable_escapes_every_control_character(text: str, expected: str | None) -> None:
    shown = render.printable(text)
    if expected is not None:
        assert shown == expected
    assert shown.isprintable()
    assert not CONTROL_RE.search(shown)


@pytest.mark.parametrize("text", ["", "plain", "GPU 0 slice 3g.40gb", "ümlaut 日本 🚀", "a\\nb"])
def test_printable_leaves_ordinary_text_alone(text: str) -> None:
    assert render.printable(text) == text


@given(st.text())
def test_printable_never_lets_a_control_character_through(text: str) -> None:
    assert not CONTROL_RE.search(render.printable(text))


def test_table_cells_are_escaped() -> None:
    out = render.table(("NAME", "REASON"), [("x\x1b]0;t\x07", "why\nnot")])
    assert "\x1b" not in out and "\x07" not in out
    assert out.count("\n") == 1  # the header and one row
    assert "why\\nnot" in out


def test_json_output_has_no_raw_control_characters() -> None:
    text = render.dumps({"name": "a\x1b]0;t\x07\u202e\x9b\x7f"})
    assert text.isascii()
    assert not CONTROL_RE.search(text.replace("\n", ""))  # indent's own newlines only
    assert json.loads(text) == {"name": "a\x1b]0;t\x07\u202e\x9b\x7f"}


def test_reasons_are_checked() -> None:
    assert check_reason("maintenance: fan") == "maintenance: fan"
    for bad in ("a\x1b[2J", "two\nlines", "x" * 1001, "\u202e"):
        with pytest.raises(InvalidInput, match="--reason"):
            check_reason(bad)


def test_check_text_refuses_bidi_and_separators() -> None:
    for bad in ("a\u202eb", "a\u2028b", "a\u2066b", "a\x85b"):
        with pytest.raises(InvalidInput, match="control character"):
            check_text("--output", bad, 100)


def test_clean_line_keeps_a_report_but_not_its_escapes() -> None:
    assert clean_line("exit\n  code 1\x1b]0;x\x07", 100) == "exit code 1\ufffd]0;x\ufffd"
    assert clean_line("x" * 50, 10) == "x" * 10


def _registration(**changes: object) -> apb.Register:
    gpu = pb.GpuUnit(
        uuid="GPU-0b3c5d7e-1111-2222-3333-444455556666",
        index=0,
        name="NVIDIA H100 80GB HBM3",
        memory=80 << 30,
        pci_bus_id="00000000:17:00.0",
    )
    mig = pb.GpuUnit(
        uuid="MIG-GPU-0b3c5d7e-1111-2222-3333-444455556666/1/0",
        index=0,
        name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        memory=10 << 30,
        parent_uuid=gpu.uuid,
        mig_profile="1g.10gb+me",
    )
    message = apb.Register(
        node="gpu-node-01.rack_2",
        gpus=[gpu, mig],
        topology=[pb.TopologyLink(a=gpu.uuid, b=mig.uuid, distance=10)],
        cpus=64,
        mem=1 << 40,
        driver="550.54.15",
        isolation="advisory: no devices cgroup\n(cgroup v2 without systemd)",
        gpu_problem="",
        version="0.9.0",
    )
    for name, value in changes.items():
        if name == "gpu":
            message.gpus[0].MergeFrom(value)  # type: ignore[arg-type]
        else:
            setattr(message, name, value)
    return message


def test_a_real_registration_is_accepted() -> None:
    check_registration(_registration())


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"node": "evil\x1b]0;x\x07"}, "node"),
        ({"node": "a\nb"}, "node"),
        ({"node": ""}, "node"),
        ({"node": "x" * 64}, "node"),
        ({"node": "-a"}, "node"),
        ({"gpu": pb.GpuUnit(name="H100\x1b[2J")}, "name"),
        ({"gpu": pb.GpuUnit(name="H100\u202e")}, "name"),
        ({"gpu": pb.GpuUnit(name="x" * 301)}, "name"),
        ({"gpu": pb.GpuUnit(uuid="GPU-1\x1b")}, "uuid"),
        ({"gpu": pb.GpuUnit(pci_bus_id="0000 17")}, "pci_bus_id"),
        ({"gpu": pb.GpuUnit(mig_profile="1g\x07")}, "mig_profile"),
        ({"gpu": pb.GpuUnit(index=5000)}, "index"),
        ({"driver": "550\x1b]8;;http://evil\x07"}, "driver"),
        ({"isolation": "advisory: \x9b2J"}, "isolation"),
        ({"gpu_problem": "no driver\x1b[31m"}, "gpu_problem"),
    ],
)
def test_a_hostile_registration_is_refused_naming_the_field(
    changes: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput, match=f"registration: .*{field}") as caught:
        check_registration(_registration(**changes))
    assert not CONTROL_RE.search(str(caught.value))


def test_a_registration_is_bounded_in_size() -> None:
    many = _registration()
    many.gpus.extend(pb.GpuUnit(uuid=f"GPU-{i}", index=0, name="x") for i in range(1030))
    with pytest.raises(InvalidInput, match="registration: gpus"):
        check_registration(many)
    links = _registration()
    links.topology.extend(pb.TopologyLink(a="GPU-a", b="GPU-b") for _ in range(70_000))
    with pytest.raises(InvalidInput, match="registration: topology"):
        check_registration(links)


def test_heartbeat_text_is_cleaned_not_refused() -> None:
    good = pb.GpuUsage(uuid="GPU-1", health="ok", notes=["pid 42 (python) of no job"])
    bad = pb.GpuUsage(
        uuid="GPU-2",
        health="unhealthy",
        health_reason="xid 79\x1b]0;pwned\x07\nagain",
        notes=["a\u202eb", *["n"] * 40],
        memory_used=5,
    )
    kept = clean_usage([good, bad])
    assert kept[0] is good
    assert kept[1].health_reason == "xid 79\ufffd]0;pwned\ufffd again"
    assert kept[1].notes[0] == "a\ufffdb" and len(kept[1].notes) == 16
    assert kept[1].memory_used == 5
    assert len(clean_usage([good] * 2000)) == 1024
