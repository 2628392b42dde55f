"""The ``xbench`` command: a thin Typer layer over the library."""

from __future__ import annotations

import sys

import typer

from xbench.cli.compare import check, compare
from xbench.cli.decide import decide
from xbench.cli.env import env
from xbench.cli.fit import fit
from xbench.cli.kernel import kernel
from xbench.cli.models import models
from xbench.cli.probe import probe
from xbench.cli.report import report
from xbench.cli.simulate import simulate
from xbench.cli.slurm import slurm
from xbench.cli.validate import validate
from xbench.version import version_line

app = typer.Typer(
    name="xbench",
    help="Route the query or fetch the cache: probe fabrics, time MLA kernels, fit a cost model, decide.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # help texts hold brackets ([check], [workload]) that are words, not markup
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Print the version and the git revision it was built from.",
    ),
) -> None:
    """xbench: measurements behind route / fetch / local decisions."""


app.command("probe")(probe)
app.command("kernel")(kernel)
app.command("fit")(fit)
app.command("decide")(decide)
app.command("validate")(validate)
app.command("compare")(compare)
app.command("check")(check)
app.command("report")(report)
app.command("simulate")(simulate)
app.command("slurm")(slurm)
app.command("models")(models)
app.command("env")(env)


def _refuse_blank_values(command) -> None:
    """Refuse a blank value (``--out "$UNSET"``, ``fit ''``) by the parameter's name.

    A blank is a slip, not a choice: a blank path reads as the current directory and a blank
    size or name as "not given", so the command would run on something nobody named, or
    fail deeper down. An option whose own default is blank (compare's ``--allow``) takes it.
    Hooked where each raw value is processed (click's ``process_value``), so every spelling
    (``--out ''``, ``--out=``, a positional ``''``) is caught, whatever the option's type.
    """
    for sub in getattr(command, "commands", {}).values():
        for param in sub.params:
            blank_default = isinstance(param.default, str) and not param.default.strip()
            if getattr(param, "is_flag", False) or blank_default:
                continue
            param.process_value = _blank_refused(param, param.process_value)


def _blank_refused(param, process_value):
    def process(ctx, value):
        values = value if isinstance(value, (list, tuple)) else [value]
        blank = next((v for v in values if isinstance(v, str) and not v.strip()), None)
        if blank is None:
            return process_value(ctx, value)
        if param.param_type_name != "option":  # named as the usage line shows it
            hint, fix = f"'{param.name.upper()}'", "give a value"
        elif param.required:
            hint, fix = None, "give a value"
        else:
            hint, fix = None, f"give a value, or leave out {param.opts[0]} for its default"
        raise typer.BadParameter(f"{blank!r} is blank; {fix}", ctx, param, param_hint=hint)

    return process


def main() -> None:
    """Run the CLI; a usage error (bad option value, unknown option) is one line too."""
    from xbench.cli.common import fail

    if sys.stdout is None:  # started with standard output closed (>&-)
        sys.stderr.write(
            "xbench: error: standard output is closed, so nothing xbench prints can be "
            "read; run it with standard output open (> FILE to keep it)\n"
        )
        sys.exit(2)
    command = typer.main.get_command(app)
    _refuse_blank_values(command)
    try:
        code = command(standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        code = 130
    except Exception as exc:
        # click's usage and parameter errors (click is vendored in newer Typer, so matched by
        # what they carry rather than by class)
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            # bare `xbench` (or a group with no command): the help, as asked, not an error
            sys.stdout.write(ctx.get_help() + "\n")
            sys.exit(0)
        hint = f"; see {ctx.command_path} --help" if ctx is not None else ""
        # one sentence: no full stop before the hint, no validator's "Value error, " prefix
        message = exc.format_message().replace("Value error, ", "").strip().rstrip(".")
        try:
            raise fail(f"{message}{hint}", exc.exit_code) from None
        except typer.Exit as done:
            code = done.exit_code
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
