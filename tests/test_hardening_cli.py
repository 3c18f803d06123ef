"""Hardening of the command lines' arguments: `day0 generate` / `day0 inspect` / `day0-opt` take
what they document or refuse it in one line naming the argument or file (rc != 0, no traceback),
on the session's compiled ds-sparse artifact (vocabulary 320, max_seq_len 64, no tokenizer)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from day0.tools.cli import ArgumentError, parse_ids

BIN = Path(sys.executable).parent
DAY0 = str(BIN / "day0")


def run(*args, tool=DAY0, **kwargs):
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, **kwargs)


def refused(r, *names: str, prefix="day0: error: ") -> str:
    """rc != 0, no traceback, one stderr line naming each of names; returns it."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), r.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


# --- --prompt-ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, ids",
    [("1,2,3", [1, 2, 3]), ("1, 2, 3", [1, 2, 3]), ("1 2 3", [1, 2, 3]), (" 7\t8\n", [7, 8]), ("0", [0])],
)
def test_prompt_ids_formats(text, ids):
    assert parse_ids(text, vocab_size=320) == ids


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "is empty"),
        ("  ", "is empty"),
        ("1,,2", "'' is not a token id"),
        ("1,2,", "'' is not a token id"),
        ("1;2", "'1;2' is not a token id"),
        ("1.5", "'1.5' is not a token id"),
        ("0x10", "'0x10' is not a token id"),
        ("+3", "'+3' is not a token id"),
        ("1_000", "'1_000' is not a token id"),
        ("\u0661", "is not a token id"),  # an Arabic-Indic digit: int() would take it
        ("-1", "'-1' is not a token id (token ids are >= 0)"),
        ("320", "token id 320 is outside the vocabulary [0, 320)"),
        (str(2**70), "token id 1180591620717411303424 is outside the vocabulary [0, 320)"),
    ],
)
def test_prompt_ids_refused_naming_the_argument(text, why):
    with pytest.raises(ArgumentError) as e:
        parse_ids(text, vocab_size=320)
    assert str(e.value).startswith("--prompt-ids") and why in str(e.value)


def test_prompt_ids_with_spaces_are_several_tokens(artifact):
    art = artifact("ds-sparse")
    spaced = run("generate", art, "--prompt-ids", "1 2 3", "--max-new-tokens", 3)
    commas = run("generate", art, "--prompt-ids", "1,2,3", "--max-new-tokens", 3)
    assert spaced.returncode == 0 and commas.returncode == 0, spaced.stderr + commas.stderr
    assert spaced.stdout == commas.stdout and len(commas.stdout.strip().split(",")) == 3


def test_generate_refuses_bad_arguments(artifact):
    art = artifact("ds-sparse")
    refused(run("generate", art, "--prompt-ids", str(2**70)), "--prompt-ids", "outside the vocabulary [0, 320)")
    refused(run("generate", art, "--prompt-ids", "1 -2"), "--prompt-ids", "'-2'")
    refused(run("generate", art, "--prompt-ids", ""), "--prompt-ids", "empty")
    refused(run("generate", art, "--prompt", ""), "--prompt", "empty")
    refused(run("generate", art, "--prompt-ids", "1", "--seed", "-1"), "--seed", "(got -1)")
    refused(run("generate", art, "--prompt-ids", "1", "--max-new-tokens", "0"), "--max-new-tokens")


# --- a checkpoint that moved -------------------------------------------------------------------


def test_moved_checkpoint_hints_at_checkpoint_dir(artifact, checkpoint, tmp_path):
    art = shutil.copytree(artifact("ds-sparse"), tmp_path / "art")
    moved = shutil.copytree(checkpoint("ds-sparse"), tmp_path / "moved-ckpt")
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["parameters"]["base_dir"] = str(tmp_path / "gone")
    (art / "manifest.json").write_text(json.dumps(manifest))
    args = ("--prompt-ids", "5,6,7", "--max-new-tokens", 4)
    for cmd in (("generate", art, *args), ("inspect", art)):
        refused(run(*cmd), str(tmp_path / "gone"), "missing", "--checkpoint-dir")
    r = run("generate", art, *args, "--checkpoint-dir", moved)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run("generate", artifact("ds-sparse"), *args).stdout
    r = run("inspect", art, "--checkpoint-dir", moved, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["parameters"]["base_dir"] == str(moved)


# --- broken pipes ------------------------------------------------------------------------------


def _into_closed_pipe(*args, tool=DAY0):
    """Run with stdout a pipe whose reader has already gone (`... | head -0`): every write fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([tool, *map(str, args)], stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)


def test_output_into_a_closed_pipe_is_quiet(artifact):
    art = artifact("ds-sparse")
    for args in (("inspect", art), ("inspect", art, "--json"), ("generate", art, "--prompt-ids", "1,2")):
        r = _into_closed_pipe(*args)
        assert r.returncode != 0 and r.stderr == "", (args, r.stderr)


def test_inspect_piped_to_head(artifact):
    r = subprocess.run(
        f"'{DAY0}' inspect '{artifact('ds-sparse')}' | head -1", shell=True, capture_output=True, text=True
    )
    assert r.stdout.startswith("artifact ") and r.stdout.count("\n") == 1 and r.stderr == ""


# --- day0-opt inputs ---------------------------------------------------------------------------

DAY0_OPT = str(BIN / "day0-opt")


def test_day0_opt_refuses_unreadable_inputs(tmp_path):
    missing = tmp_path / "missing.mlir"
    refused(run(missing, tool=DAY0_OPT), str(missing), "No such file", prefix="day0-opt: ")
    binary = tmp_path / "model.vmfb"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    refused(run(binary, tool=DAY0_OPT), str(binary), "not UTF-8", prefix="day0-opt: ")
    nul = tmp_path / "nul.mlir"
    nul.write_bytes(b"module {\x00}")
    refused(run(nul, tool=DAY0_OPT), str(nul), "NUL", prefix="day0-opt: ")
    refused(run(tmp_path, tool=DAY0_OPT), str(tmp_path), "directory", prefix="day0-opt: ")
    r = run("-", tool=DAY0_OPT, input=None, stdin=open(binary, "rb"))  # noqa: SIM115
    refused(r, "<stdin>", "not UTF-8", prefix="day0-opt: ")


def test_day0_opt_text_that_is_not_mlir(tmp_path):
    text = tmp_path / "notes.mlir"
    text.write_text("hello world\n")
    r = run(text, tool=DAY0_OPT)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and str(text) in lines[0]
