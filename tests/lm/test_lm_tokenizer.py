import pytest

from deamoe_trt.errors import UsageError
from deamoe_trt.lm import ByteTokenizer


def test_round_trip_of_printable_ascii_and_newlines():
    tok = ByteTokenizer()
    text = "Anne Elliot, 1818!\n~{}"
    assert tok.encode(text) == list(text.encode())
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("caf\u00e9", "'\u00e9' (U+00E9) at character 4"),
        (
            "it\u2019s",
            "(U+2019) at character 3, which this model's byte tokenizer does not know; it knows newline and "
            "printable ASCII (space to '~') (write \"'\" instead)",
        ),
        ("a\tb", "tab (U+0009) at character 2"),
    ],
)
def test_unknown_characters_are_named(text, fragment):
    with pytest.raises(UsageError) as info:
        ByteTokenizer().encode(text)
    assert fragment in str(info.value)


def test_decode_is_lenient():
    assert ByteTokenizer().decode([72, 0xFF, 300, 27, 105]) == "H\ufffd\ufffd\ufffdi"


def test_json_round_trip_and_checks():
    tok = ByteTokenizer(alphabet="ab\n")
    assert ByteTokenizer.from_dict(tok.to_dict()) == tok
    with pytest.raises(UsageError):
        ByteTokenizer.from_dict({"type": "bpe"})
    with pytest.raises(UsageError):
        ByteTokenizer(vocab_size=100)


def test_chat_template_jinja_is_read_and_travels_with_the_tokenizer(tmp_path):
    """transformers 5 saves the chat template as chat_template.jinja, not in tokenizer_config.json."""
    from importers.hf_lm_models import CHAT_TEMPLATE, make_tokenizer

    from deamoe_trt.lm.tokenizer import HFTokenizer

    source, copy = tmp_path / "source", tmp_path / "copy"
    source.mkdir()
    make_tokenizer().save(str(source / "tokenizer.json"))
    (source / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    (source / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (source / "generation_config.json").write_text('{"eos_token_id": 2}')
    assert HFTokenizer(source, 96).chat("w5") == "<|im_start|> user w5 </s> <|im_start|> w1 "
    copy.mkdir()
    HFTokenizer(source, 96).save(copy)
    assert (copy / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert (copy / "generation_config.json").is_file()
