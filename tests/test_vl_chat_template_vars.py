"""`vl chat --template-var NAME=VALUE` (the `template_kwargs` request option; `chat_template_kwargs` on a server),
in-process through `vl.cli.chat.main` on a copy of the demo model whose tokenizer carries a Nemotron 3 style template
that reads one extra variable (docs/app_and_cli.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "vl" / "demo"
needs_demo = pytest.mark.skipif(not (DEMO / "config.json").is_file(),
                                reason="the demo model (vl/demo) is not trained yet; vl train-demo makes it")


@needs_demo
def test_template_vars_reach_the_template_and_bad_ones_are_refused_before_loading(tmp_path, capsys):
    """`--template-var` (the `template_kwargs` option; `chat_template_kwargs` on a server): a variable the model's
    template reads changes the prompt, one it does not read changes nothing, and a malformed, repeated or reserved
    one is a usage or option error (exit 2); a good question after them answers as before."""
    import shutil

    sys.path.insert(0, str(REPO / "tests" / "processing"))
    from card_templates import NEMOTRON3_TEMPLATE
    from vl.cli.chat import main

    d = tmp_path / "model"
    shutil.copytree(DEMO, d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    system = "'<|im_start|>system\\n' + system_text"
    assert system in NEMOTRON3_TEMPLATE
    config["chat_template"] = NEMOTRON3_TEMPLATE.replace(system, system + " + (brief if brief is defined else '')")
    (d / "tokenizer_config.json").write_text(json.dumps(config))

    def ask(*flags):
        code = main(["--model", str(d), "--prompt", "What can you read?", "--json", "--max-new-tokens", "3", *flags])
        return code, json.loads(capsys.readouterr().out)

    code, plain = ask()
    assert code in (0, 3) and plain["stats"]["prompt_tokens"] > 0
    code, hinted = ask("--template-var", "brief=\" Be brief.\"")
    assert code in (0, 3) and hinted["stats"]["prompt_tokens"] > plain["stats"]["prompt_tokens"]
    unread = ask("--template-var", "never_read=true")[1]
    assert unread["stats"]["prompt_tokens"] == plain["stats"]["prompt_tokens"]
    assert any("never_read ignored" in n for n in unread["stats"]["notes"]) and not hinted["stats"]["notes"]
    for flags, words in ((["--template-var", "messages=1"], "set by the renderer"),
                         (["--template-var", "brief=1", "--template-var", "brief=2"], "sets brief more than once"),
                         (["--template-var", "brief=[1]"], "true/false, a finite number")):
        code, out = ask(*flags)
        assert code == 2 and out["error"]["code"] == "bad_generation_option" and words in out["error"]["message"]
    with pytest.raises(SystemExit):  # argparse: NAME=VALUE expected
        main(["--model", str(d), "--prompt", "x", "--template-var", "brief"])
    capsys.readouterr()
    again = ask("--template-var", "brief=\" Be brief.\"")[1]
    assert (again["answer"], again["stats"]["prompt_tokens"]) == (hinted["answer"], hinted["stats"]["prompt_tokens"])
