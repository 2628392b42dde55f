"""The ``xbench`` command: a thin Typer layer over the library."""

from __future__ import annotations

import typer

import xbench
from xbench.cli.decide import decide
from xbench.cli.env import env
from xbench.cli.fit import fit
from xbench.cli.kernel import kernel
from xbench.cli.models import models
from xbench.cli.probe import probe
from xbench.cli.slurm import slurm
from xbench.cli.validate import validate

app = typer.Typer(
    name="xbench",
    help="Route the query or fetch the cache: probe fabrics, time MLA kernels, fit a cost model, decide.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"xbench {xbench.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """xbench: measurements behind route / fetch / local decisions."""


app.command("probe")(probe)
app.command("kernel")(kernel)
app.command("fit")(fit)
app.command("decide")(decide)
app.command("validate")(validate)
app.command("slurm")(slurm)
app.command("models")(models)
app.command("env")(env)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
