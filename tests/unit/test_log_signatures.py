"""Failure signatures as data (gpuq.domain.log_signatures, gpuq.signature_files): gpuq's own
file parses, an admin's file adds entries, replaces one by name or switches it off, and a bad
file is one clear error naming the file, the entry and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_spec

from gpuq.domain.diagnosis import EndEvidence, Evidence, diagnose
from gpuq.domain.log_signatures import last_traceback, tail_lines
from gpuq.domain.model import Job, JobResult
from gpuq.domain.states import JobState
from gpuq.errors import ConfigError
from gpuq.signature_files import load_signatures

LUSTRE = """
[[signature]]
name = "lustre-evicted"
pattern = 'Lustre: .* evicted|Cannot send after transport endpoint shutdown'
meaning = "the job's files were on a Lustre mount that evicted this node"
advice = "submit it again; tell the admins which node (gpuq show says)"
weight = 92
"""


def failed_with(output: str, signatures: object) -> list[str]:
    job = Job(
        id=3,
        spec=make_spec("x", gpus=1),
        user="alice",
        state=JobState.FAILED,
        qos="normal",
        priority=0,
        submit_time=1.0,
        start_time=2.0,
        end_time=3.0,
        node="a",
        result=JobResult(1, None, "exit code 1"),
        start_count=1,
    )
    evidence = Evidence(job, ends=(EndEvidence("a", 1, 0, output),))
    return [v.name for v in diagnose(evidence, signatures)]  # type: ignore[arg-type]


def test_an_admins_signature_is_added_and_ranks_by_its_weight(tmp_path: Path) -> None:
    path = tmp_path / "site.toml"
    path.write_text(LUSTRE)
    signatures = load_signatures(str(path))
    output = "LustreError: 11-0: scratch-OST0003: Lustre: client evicted\nNCCL error in: x\n"
    assert failed_with(output, signatures)[:2] == ["lustre-evicted", "nccl-error"]
    assert "lustre-evicted" not in failed_with(output, load_signatures())


def test_an_entry_of_the_same_name_replaces_gpuqs_and_disabled_switches_it_off(
    tmp_path: Path,
) -> None:
    path = tmp_path / "site.toml"
    path.write_text(
        '[[signature]]\nname = "disk-full"\npattern = "No space left"\n'
        'meaning = "scratch is full"\nadvice = "clean /scratch"\nweight = 99\n'
        '[[signature]]\nname = "segfault"\npattern = "x"\nmeaning = "m"\nadvice = "a"\n'
        "disabled = true\n"
    )
    signatures = {s.name: s for s in load_signatures(str(path))}
    assert signatures["disk-full"].meaning == "scratch is full"
    assert "segfault" not in signatures
    assert "cuda-oom" in signatures


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[[signature]\n", "not TOML"),
        (
            '[[signature]]\nname = "a"\npattern = "(unclosed"\nmeaning = "m"\nadvice = "a"\n',
            'signature 1: pattern = "(unclosed": not a regular expression',
        ),
        (
            '[[signature]]\nname = "Bad Name"\npattern = "x"\nmeaning = "m"\nadvice = "a"\n',
            'name = "Bad Name"',
        ),
        ('[[signature]]\nname = "a"\npattern = "x"\nmeaning = "m"\n', "advice"),
        (
            '[[signature]]\nname = "a"\npattern = "x"\nmeaning = "m"\nadvice = "a"\n'
            "weight = 5000\n",
            "weight",
        ),
        (
            '[[signature]]\nname = "a"\npattern = "x"\nmeaning = "m"\nadvice = "a"\ncolour = 1\n',
            "colour",
        ),
        ("[rules]\nx = 1\n", "only [[signature]]"),
    ],
)
def test_a_bad_file_is_one_error_naming_the_file_and_key(
    tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_signatures(str(path))
    assert str(path) in str(caught.value) and words in str(caught.value)


def test_a_missing_file_is_one_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"diagnosis_signatures.*unreadable"):
        load_signatures(str(tmp_path / "nope.toml"))


def test_a_traceback_with_rank_labels_and_a_chained_exception_gives_the_last_one() -> None:
    text = (
        "0: Traceback (most recent call last):\n"
        '0:   File "a.py", line 3, in <module>\n'
        "0:     f()\n"
        "0: KeyError: 'lr'\n"
        "0: \n"
        "0: During handling of the above exception, another exception occurred:\n"
        "0: \n"
        "0: Traceback (most recent call last):\n"
        '0:   File "a.py", line 9, in <module>\n'
        "0:     g()\n"
        '0:   File "/lib/b.py", line 40, in g\n'
        "0:     raise RuntimeError('config broken')\n"
        "0: RuntimeError: config broken\n"
    )
    found = last_traceback(tail_lines(text))
    assert found is not None
    assert (found.file, found.line, found.function) == ("/lib/b.py", 40, "g")
    assert found.exception == "RuntimeError: config broken"
    assert found.code == "raise RuntimeError('config broken')"


def test_a_traceback_cut_off_before_its_exception_is_not_read() -> None:
    text = 'Traceback (most recent call last):\n  File "a.py", line 3, in <module>\n    f()\n'
    assert last_traceback(tail_lines(text)) is None
