from deamoe_trt.lm import load_lm
from deamoe_trt.train.lm import TrainSettings, save_trained, shipped_text, train

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
