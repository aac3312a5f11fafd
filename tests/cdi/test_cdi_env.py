"""The DRA env entries (behavior.md §13.2), the strict cpuset parse they use, and the Go
text forms shared by the messages."""

from __future__ import annotations

import pytest

from dracpu.cdi.env import DRAEnvError, cdi_env_entry, parse_dra_env
from dracpu.cpuset import CPUSet, CPUSetParseError, parse_cpuset
from dracpu.gofmt import go_quote


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ([], {}),
        (["PATH=/bin", "HOME=/root"], {}),
        (["DRA_CPUSET_A=0-3"], {"A": "0-3"}),
        (
            ["DRA_CPUSET_6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162=2-3,10-11"],
            {"6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162": "2-3,10-11"},
        ),
        (["DRA_CPUSET_A=0,1", "DRA_CPUSET_B=4-7"], {"A": "0-1", "B": "4-7"}),
        # later entries for the same UID overwrite earlier ones
        (["DRA_CPUSET_A=0", "DRA_CPUSET_A=1"], {"A": "1"}),
        # an empty value is the empty set (it fails validation later)
        (["DRA_CPUSET_A="], {"A": ""}),
        # no underscore after the prefix: not a claim entry
        (["DRA_CPUSETX=0-3", "DRA_CPUSET=1"], {}),
        # the UID is the rest of the key, verbatim (even empty)
        (["DRA_CPUSET_=2"], {"": "2"}),
        # only the first '=' splits
        (["OTHER=DRA_CPUSET_A=1", "dra_cpuset_a=1"], {}),
    ],
)
def test_parse_dra_env(env: list[str], expected: dict[str, str]) -> None:
    assert parse_dra_env(env) == {uid: CPUSet.parse(v) for uid, v in expected.items()}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("DRA_CPUSET_A", 'malformed DRA env entry "DRA_CPUSET_A"'),
        ("DRA_CPUSETX", 'malformed DRA env entry "DRA_CPUSETX"'),
        ("DRA_CPUSET", 'malformed DRA env entry "DRA_CPUSET"'),
        (
            "DRA_CPUSET_A=a-b",
            'failed to parse cpuset value "a-b" from env "DRA_CPUSET_A=a-b": '
            "invalid cpuset 'a-b': not a cpu id or range: 'a-b'",
        ),
        (
            "DRA_CPUSET_A=3-1",
            'failed to parse cpuset value "3-1" from env "DRA_CPUSET_A=3-1": '
            "invalid cpuset '3-1': range end below its start: '3-1'",
        ),
        (
            "DRA_CPUSET_A=1,",
            'failed to parse cpuset value "1," from env "DRA_CPUSET_A=1,": '
            "invalid cpuset '1,': empty item: ''",
        ),
        (
            "DRA_CPUSET_A=0=1",
            'failed to parse cpuset value "0=1" from env "DRA_CPUSET_A=0=1": '
            "invalid cpuset '0=1': not a cpu id or range: '0=1'",
        ),
        (
            "DRA_CPUSET_A=1\n",
            'failed to parse cpuset value "1\\n" from env "DRA_CPUSET_A=1\\n": '
            "invalid cpuset '1\\n': not a cpu id or range: '1\\n'",
        ),
    ],
)
def test_parse_dra_env_errors(entry: str, message: str) -> None:
    with pytest.raises(DRAEnvError) as info:
        parse_dra_env(["PATH=/bin", "DRA_CPUSET_OK=1", entry])
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("cpus", ["", "0", "2-3,10-11", "0-127"])
def test_an_entry_reads_back_as_what_was_written(cpus: str) -> None:
    uid = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"
    entry = cdi_env_entry(uid, CPUSet.parse(cpus))
    assert entry == f"DRA_CPUSET_{uid}={cpus}"
    assert parse_dra_env([entry]) == {uid: CPUSet.parse(cpus)}


def test_parse_cpuset_refuses_the_sysfs_newline() -> None:
    assert parse_cpuset("0-3,8") == CPUSet.parse("0-3,8")
    assert parse_cpuset("") == CPUSet()
    with pytest.raises(CPUSetParseError):
        parse_cpuset("0-3\n")


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("", '""'),
        ("abc-123", '"abc-123"'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"'),
        ("\x00\x1f\x7f", '"\\x00\\x1f\\x7f"'),
        ("héllo ünïcode", '"héllo ünïcode"'),
        ("\u00a0\u200b", '"\\u00a0\\u200b"'),
        ("\U000e0001", '"\\U000e0001"'),
        ("\ud800", '"\\ufffd"'),
    ],
)
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted
