from importlib import resources

import pytest
import torch
import torch.utils.deterministic

from deamoe_trt.errors import UsageError
from deamoe_trt.lm import ByteTokenizer, load_lm
from deamoe_trt.train.determinism import deterministic_threads
from deamoe_trt.train.lm import CORPORA, TrainSettings, save_trained, shipped_text, split_text, train

SETTINGS = TrainSettings(steps=12, batch_size=4, seq_len=32, lr=1e-2, warmup=2, eval_batches=2, log_every=4)


def test_quick_training_lowers_the_loss_and_is_deterministic(micro_config, tmp_path):
    text = shipped_text()[:20000]
    first = train(micro_config, SETTINGS, text=text, progress=False)
    again = train(micro_config, SETTINGS, text=text, progress=False)
    assert first.losses == again.losses
    assert first.val_loss == again.val_loss
    assert first.val_loss < first.initial_val_loss - 0.5
    assert sum(first.losses[-3:]) < sum(first.losses[:3])
    out = save_trained(first, SETTINGS, tmp_path / "m")
    loaded = load_lm(out)
    assert loaded.training["steps"] == 12 and loaded.training["val_loss"] == round(first.val_loss, 4)


def test_shipped_text_is_ascii_printable():
    text = shipped_text()
    assert 400_000 < len(text) < 500_000
    assert text.startswith("Persuasion")
    assert set(text) <= set("\n" + "".join(chr(c) for c in range(32, 127)))


PRINTABLE = set("\n" + "".join(chr(c) for c in range(32, 127)))


def test_the_six_novels_end_with_persuasion_whose_end_is_held_out():
    novels, persuasion = shipped_text("austen"), shipped_text()
    assert 4_000_000 < len(novels) < 4_100_000
    assert novels.startswith("SENSE AND SENSIBILITY") and novels.endswith(persuasion)
    assert set(novels) <= PRINTABLE
    # The held-out tenth of the text training splits off lies inside Persuasion.
    _, held_out = split_text(novels, ByteTokenizer(), TrainSettings().val_fraction)
    assert len(held_out) < len(persuasion)
    assert ByteTokenizer().decode(held_out.tolist()) == persuasion[-len(held_out) :]


def test_an_unknown_text_is_refused_in_one_line():
    with pytest.raises(UsageError, match="unknown text 'tolstoy'; shipped: persuasion, austen, cpython") as error:
        shipped_text("tolstoy")
    assert "\n" not in str(error.value) and set(CORPORA) == {"persuasion", "austen", "cpython"}


def test_the_cpython_text_is_the_named_standard_library_modules_whole():
    text = shipped_text("cpython")
    assert 400_000 < len(text) < 500_000 and set(text) <= PRINTABLE
    names = [
        line[len("# ===== Lib/") : -len(" =====")] for line in text.splitlines() if line.startswith("# ===== Lib/")
    ]
    assert names[0] == "abc.py" and names[-1] == "difflib.py" and len(names) == 23
    # Each module is its source unchanged: textwrap's begins with its docstring.
    assert '# ===== Lib/textwrap.py =====\n"""Text wrapping and filling.' in text
    assert (
        "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2"
        in (resources.files("deamoe_trt.lm") / "data" / "cpython-LICENSE.txt").read_text()
    )


def test_deterministic_threads_restores_the_settings_it_changes():
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    fill = torch.utils.deterministic.fill_uninitialized_memory
    with deterministic_threads(1):
        assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before
    assert torch.utils.deterministic.fill_uninitialized_memory == fill
