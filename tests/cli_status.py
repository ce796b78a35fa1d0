"""The CLI's exit status for a test, argparse's own refusals (SystemExit 2) included."""

from deamoe_trt.cli.main import main


def cli_main(argv: list[str]) -> int:
    """The CLI's exit status, argparse's refusals (SystemExit 2) included."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
