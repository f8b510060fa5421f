"""``python -m runtime eval``: its options and its exit codes.

Exit codes: 0 the run completed; 1 it stopped early (too many failed calls, a server
exited), a function could not start, the LLM did not answer its test completion, or
``--fail-on-flags`` and a red flag was raised; 2 a usage error (the command line, the job
file, the data, ``--out``); 128 + the signal when stopped by one (130 Ctrl-C, 143 SIGTERM,
129 SIGHUP). Only argparse is imported at module level: ``serve`` builds this parser too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.eval.files import OutDir

__all__ = ["COMMAND", "add_command", "run"]

COMMAND = "eval"


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:  # nan too
            raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
        return value

    return parse


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text!r}")
    return value


def add_command(commands: Any) -> None:
    """Add ``eval`` to ``python -m runtime``'s subparsers."""
    parser = commands.add_parser(
        COMMAND,
        help="try the job's functions on its data, locally, before training",
        description="Serve each function of the job file from the package `register` would "
        "upload, run K rollouts for each of the first N data lines against an "
        "OpenAI-compatible LLM, score them with every reward and group reward over HTTP, "
        "and report scores, failures, latencies and red flags; or, with --compare OLD NEW, "
        "compare two earlier runs. Exit codes: 0 completed; "
        "1 stopped early, a function could not start, the LLM did not answer, or a red flag "
        "with --fail-on-flags; 2 usage error (with --compare: a directory that is not a "
        "run's --out, or runs with no sample in common); 130 Ctrl-C, 143 SIGTERM, "
        "129 SIGHUP.",
        epilog="example: cd sample_functions && python -m runtime eval -c rl-job.yaml "
        "--llm-base-url http://127.0.0.1:8001/v1 --out /tmp/calc-eval  (keep --out outside "
        "the workspace: register would package it); then, after a change, a run with --out "
        "/tmp/calc-eval-2 and: python -m runtime eval --compare /tmp/calc-eval "
        "/tmp/calc-eval-2",
    )
    parser.add_argument("-c", "--config", metavar="YAML", help="the job file (required to run)")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="compare two earlier runs (their --out directories) instead of running: each "
        "reward's and sub-reward's mean, std, failure rate and zero-variance share side by "
        "side, the change and whether it is significant (a paired sign-flip test over the samples "
        "both scored), the samples that changed most; a table, and compare.html written "
        "into NEW, or into --out DIR when given",
    )
    parser.add_argument(
        "--split",
        choices=("training", "validation"),
        default="training",
        help="which of the job's datasets (default training)",
    )
    parser.add_argument(
        "--data", metavar="FILE.jsonl", help="a JSONL file to use instead of the job's dataset"
    )
    parser.add_argument(
        "--samples",
        "-n",
        type=_positive(int),
        default=32,
        metavar="N",
        help="the first N lines of the data (default 32)",
    )
    parser.add_argument(
        "--rollouts",
        "-k",
        type=_positive(int),
        metavar="K",
        help="rollouts per line (default: the job's n_rollouts, else 4)",
    )
    parser.add_argument(
        "--concurrency",
        type=_positive(int),
        default=16,
        metavar="C",
        help="calls in flight at once, all functions together (default 16)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write trajectories.jsonl, summary.json, report.html and the servers' logs here "
        "(checked before the run; a directory holding other files is refused without --force); "
        "with --compare: where compare.html goes (default: NEW)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a --out directory that holds other files (eval's own are replaced, "
        "the others left alone)",
    )
    llm = parser.add_argument_group("the LLM (any OpenAI-compatible endpoint)")
    llm.add_argument("--llm-base-url", help="e.g. http://127.0.0.1:8001/v1 [env LLM_BASE_URL]")
    llm.add_argument("--llm-model", help="the model name [env LLM_MODEL; default: model.name]")
    llm.add_argument(
        "--llm-api-key", help="sent to the LLM only, never printed [env LLM_API_KEY; default EMPTY]"
    )
    llm.add_argument(
        "--llm-timeout",
        type=_positive(float),
        default=60.0,
        metavar="S",
        help="seconds for the test completion eval sends first, and for each chat completion "
        "it asks itself (a job without a rollout) (default 60)",
    )
    parser.add_argument(
        "--ground-truth-key",
        metavar="KEY",
        help="where a line's ground_truth is, a dotted path (default: ground_truth, else "
        "rollout_extra.solution; an assumption about how the platform fills it)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="send sampling_params.seed = S + k to the k-th rollout of a line, for runs that "
        "repeat on an endpoint that honours seeds (default: no seed)",
    )
    parser.add_argument(
        "--max-failure-rate",
        type=_rate,
        default=0.5,
        metavar="F",
        help="stop early when a function fails more than this share of its calls, after its "
        "first 20 (default 0.5)",
    )
    parser.add_argument(
        "--fail-on-flags", action="store_true", help="exit 1 when a red flag is raised (for CI)"
    )


class _Signalled(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: Any) -> None:
    # SIGTERM and SIGHUP (the terminal closed) stop the run as Ctrl-C does: every server
    # stopped, the temporary directory removed
    raise _Signalled(signum)


_STOPPING = (signal.SIGTERM, signal.SIGHUP)


def run(args: argparse.Namespace) -> int:
    """Run ``eval``; its exit status."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in _STOPPING}
    try:
        try:
            return _run(args)
        except asyncio.CancelledError:
            # Ctrl-C in anyio.run before Python 3.11: the main task is cancelled, and
            # without Task.uncancel the cancellation comes out instead of KeyboardInterrupt
            if sys.version_info >= (3, 11):
                raise
            raise KeyboardInterrupt from None
        except BaseException as exc:
            # a signal that landed in a task of a task group comes out in a group
            found = _interruption(exc)
            if found is None or found is exc:
                raise
            raise found from None
    except KeyboardInterrupt as exc:
        # a second signal while stopping must not cut the cleanup short
        for sig in _STOPPING:
            signal.signal(sig, signal.SIG_IGN)
        print("interrupted: every server eval started is stopped", file=sys.stderr)
        return 128 + (exc.signum if isinstance(exc, _Signalled) else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interruption(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP as ``_Signalled``) in ``exc``, an
    exception group's members included; None if there is none."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    for member in getattr(exc, "exceptions", ()):  # BaseExceptionGroup (or its backport)
        if (found := _interruption(member)) is not None:
            return found
    return None


_scrub: Any = str  # the run's Scrubber.text once the plan is made


def _error(message: str, code: int) -> int:
    from runtime.eval.files import terminal

    print(f"error: {terminal(_scrub(message))}", file=sys.stderr)  # a name, a data line
    return code


# compare.html: what `--compare` wrote into this run's directory, stale once it is rerun
_OWN_FILES = ("trajectories.jsonl", "summary.json", "report.html", "compare.html", "logs")


def _not_for_compare(args: argparse.Namespace) -> list[str]:
    """The options given with ``--compare`` that only a run uses (those not at their
    default)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_command(parser.add_subparsers())
    defaults = vars(parser.parse_args([COMMAND]))
    return [
        f"--{name.replace('_', '-')}"
        for name, default in defaults.items()
        if name not in ("compare", "out") and getattr(args, name, default) != default
    ]


def _own(out: OutDir, name: str) -> bool:
    """One of eval's files, as an earlier run left it (``logs/``: server logs only); a link
    is never one."""
    import stat

    kind = out.kind(name)
    if name not in _OWN_FILES or kind is None:
        return False
    if name != "logs":
        return kind == stat.S_IFREG
    if kind != stat.S_IFDIR:
        return False
    with out.opened(name) as logs:
        return all(n.endswith(".log") and logs.kind(n) == stat.S_IFREG for n in logs.names())


def _prepare_out(out: Path, force: bool) -> OutDir | str:
    """Create ``out`` and check it can be written, before anything starts; eval's files of an
    earlier run there are removed (never to be mistaken for this run's). The directory, held
    open (every file is written in it, whatever its path leads to later), or why not."""
    from runtime.eval.files import OutDir

    if out.is_symlink():  # its files are written in place, never through a link
        return f"--out {out}: is a symbolic link; name the directory it points to"
    if out.exists() and not out.is_dir():
        return f"--out {out}: exists and is not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
        directory = OutDir.open(out)  # a link made there since: ELOOP
    except OSError as exc:
        return f"--out {out}: cannot write there: {exc.strerror or exc}"
    problem = None
    try:
        directory.check_writable()
        others = [name for name in directory.names() if not _own(directory, name)]
        if others and not force:
            shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
            problem = (
                f"--out {out}: holds files that are not eval's ({shown}); choose an empty or "
                "new directory, or pass --force (eval's files are replaced, the others left "
                "alone)"
            )
    except OSError as exc:
        problem = f"--out {out}: cannot write there: {exc.strerror or exc}"
    for name in () if problem else _OWN_FILES:
        try:
            if _own(directory, name):  # not a user's (kept under --force), and there
                directory.remove(name)
        except OSError as exc:
            problem = f"--out {out}: cannot replace {name}: {exc.strerror or exc}"
            break
    if problem:
        directory.close()
        return problem
    return directory


def _run(args: argparse.Namespace) -> int:
    global _scrub
    if args.compare:
        from runtime.eval import compare

        if given := _not_for_compare(args):
            return _error(f"{', '.join(given)}: do not apply to --compare (only --out does)", 2)
        old, new = args.compare
        return compare.run(old, new, args.out)
    if not args.config:
        return _error("the following arguments are required: -c/--config (or --compare)", 2)
    from runtime.eval import plan as plans
    from runtime.eval.serving import remove_stale

    remove_stale()  # what an eval killed with -9 left
    try:
        plan = plans.make(
            args.config,
            split=args.split,
            data=args.data,
            samples=args.samples,
            rollouts=args.rollouts,
            concurrency=args.concurrency,
            llm_base_url=args.llm_base_url or os.environ.get("LLM_BASE_URL"),
            llm_model=args.llm_model or os.environ.get("LLM_MODEL"),
            llm_api_key=args.llm_api_key or os.environ.get("LLM_API_KEY") or "EMPTY",
            llm_timeout=args.llm_timeout,
            ground_truth_key=args.ground_truth_key,
            seed=args.seed,
            max_failure_rate=args.max_failure_rate,
        )
    except plans.PlanError as exc:
        return _error(str(exc), 2)
    except plans.StartError as exc:
        return _error(str(exc), 1)
    _scrub = plan.scrub.text
    out = Path(args.out) if args.out else None
    with contextlib.ExitStack() as held:
        directory = None
        if out is not None:
            prepared = _prepare_out(out, args.force)
            if isinstance(prepared, str):
                return _error(prepared, 2)
            directory = held.enter_context(prepared)
        return _evaluate(args, plan, out, directory)


def _evaluate(
    args: argparse.Namespace, plan: Any, out: Path | None, directory: OutDir | None
) -> int:
    """The run itself, once the plan is made and ``--out`` (``directory``) is open."""
    from runtime.eval import plan as plans
    from runtime.platform.functions import ComponentError, check_imports
    from runtime.platform.progress import Reporter

    if plan.rollout is None:
        try:
            import openai  # noqa: F401
        except ImportError:
            return _error(
                "the job has no rollout, so eval asks the LLM itself, with the openai "
                "package: pip install 'agentic-rl-runtime[eval]'",
                2,
            )

    reporter = Reporter()
    if warning := plan.scrub.warning():
        reporter.note(warning)
    components = [f.component for f in plan.functions]
    try:
        if components:  # an OPD job may have none: the LLM alone is tried
            check_imports(components, reporter)
    except ComponentError as exc:
        return _error(str(exc), 1)
    weights = {
        f.name: dict(f.component.spec.reward_metric_weight or f.component.weights or {})
        for f in plan.functions
        if f.kind == "reward" and f.component.spec is not None
    }

    from runtime.eval import probe, report, runner, serving, stats

    assert plan.llm is not None
    try:
        with reporter.step(f"asking the LLM for a test completion ({plan.llm.model})"):
            warning = probe.probe(plan.llm, plan.scrub)
    except probe.ProbeError as exc:
        return _error(str(exc), 1)
    if warning:
        reporter.note(warning)

    inside = out and next(
        (f for f in plan.functions if out.resolve().is_relative_to(f.component.zipdir)), None
    )
    if inside:
        reporter.note(
            f"note: {out} is inside the workspace {inside.component.zipdir}: `register` would "
            "package it with the functions; write it elsewhere, or exclude it "
            "(FC_ZIP_EXCLUDE_PATTERNS)"
        )
    logs: dict[str, str] = {}  # each server's log, once stopped: sub-rewards' errors
    try:
        with contextlib.ExitStack() as stack:
            starting = f"starting {len(plan.functions)} function(s) from their packages"
            with reporter.step(starting) if plan.functions else contextlib.nullcontext():
                served = stack.enter_context(
                    serving.serve_all(plan.functions, directory, plan.scrub.text, logs)
                )
            urls = {name: s.url for name, s in served.items()}
            results = runner.run(plan, urls, serving.exited(served))
    except plans.StartError as exc:
        return _error(str(exc), 1)

    summary = stats.summarise(plan, results, weights, logs)
    try:  # the files first: a table that fails to print must not lose them
        if out is not None and directory is not None:
            report.write_files(plan, results, summary, directory)
            try:
                page = report.write_html(plan, results, summary, directory)
                written = f"{out / 'trajectories.jsonl'}, {out / 'summary.json'}, {page}"
            except report.ReportUnavailable as exc:
                written = f"{out / 'trajectories.jsonl'}, {out / 'summary.json'}"
                reporter.note(f"warning: {exc}")
            except Exception as exc:  # the page is a view: its failure loses no numbers
                written = f"{out / 'trajectories.jsonl'}, {out / 'summary.json'}"
                why = f"{type(exc).__name__}: {exc}"
                reporter.note(_scrub(f"warning: report.html not written: {why}"))
    finally:
        report.print_table(summary)
    if out is not None:
        reporter.note(f"wrote {written}")
    if results.stopped:
        return _error(results.stopped, 1)
    if args.fail_on_flags and summary["flags"]:
        return _error(f"{len(summary['flags'])} red flag(s) (--fail-on-flags)", 1)
    return 0
