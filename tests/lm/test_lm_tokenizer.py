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
