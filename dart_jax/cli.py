"""The `dart-jax` command: one subcommand per role or job; each calls one function.

    dart-jax run configs/local.yaml                 # a whole run (what `make run` runs)
    dart-jax config show configs/local.yaml trainer.optimizer.lr=1e-5
    dart-jax keys keys/ trainer

Role subcommands import only their role's code, so an env host never loads JAX and a TPU
trainer never loads torch: each subcommand imports its own code inside its function, the
one deliberate place for imports within functions. A bad config, path, id or value prints
one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from dart_jax import config as config_lib

Command = Callable[[argparse.Namespace], int]


def _load_run_config(args: argparse.Namespace):
    from dart_jax.run.schema import RunConfig
    return config_lib.load(RunConfig, args.config, args.overrides)


def cmd_config_show(args: argparse.Namespace) -> int:
    print(config_lib.dump(_load_run_config(args)), end="")
    return 0


def _role_setup(args: argparse.Namespace, role: str):
    """Resolve the run config, create the run directory and the role's log file."""
    from dart_jax import logs
    from dart_jax.rundir import RunDir
    cfg = _load_run_config(args)
    run = RunDir.create(Path(cfg.run.root) / cfg.run.name)
    if not run.config_path.exists():
        run.config_path.write_text(config_lib.dump(cfg))
    logs.setup(role, run.log_path(role), cfg.run.log_level)
    return cfg, run


def cmd_env_server(args: argparse.Namespace) -> int:
    from envs import server
    cfg, run = _role_setup(args, "env-server")
    server.run(cfg.envs, run.metrics_path("env-server").parent)
    return 0


def cmd_data_manager(args: argparse.Namespace) -> int:
    from dart_jax.data import service
    cfg, run = _role_setup(args, "data-manager")
    service.run(cfg.data, run.root, cfg.run.mode)
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from rollout_gpu import main
    cfg, run = _role_setup(args, f"rollout-{_load_run_config(args).rollout.worker_id}")
    return main.main(cfg, run)


def cmd_train(args: argparse.Namespace) -> int:
    import json
    from dart_jax.train import main
    cfg, run = _role_setup(args, "trainer")
    print(json.dumps(main.main(cfg, run)))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import json
    from dart_jax import logs
    from dart_jax.run import main
    cfg = _load_run_config(args)
    main.check_share_writable(cfg.tpu.shared_root, (Path(cfg.run.root) / cfg.run.name).absolute())  # before its log
    logs.setup("run", Path(cfg.run.root) / cfg.run.name / "logs" / "run.log", cfg.run.log_level)
    main.stop_on_sigterm()
    try:
        print(json.dumps(main.run(cfg)))
    except main.RunFailed as e:
        print(f"dart-jax: run stopped: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import json
    from dart_jax.eval import main
    cfg, run = _role_setup(args, f"eval-{main.check_label(args.label)}")
    print(json.dumps(main.main(cfg, run, args.policy, args.label)))
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from dart_jax.wire import curve
    public, secret = curve.generate(args.directory, args.name)
    print(f"public key: {public}\nsecret key: {secret}")
    return 0


def cmd_ping(args: argparse.Namespace) -> int:
    """Exit 0 when the server of LINK answers Ping within --timeout, else 1 (a liveness probe)."""
    import dataclasses
    from dart_jax.wire import Client, RemoteError, WireTimeout
    from dart_jax.wire.messages import Ping
    cfg = _load_run_config(args)
    section, name = args.link.split(".")
    wire = dataclasses.replace(getattr(getattr(cfg, section), name), timeout_s=args.timeout)
    try:
        with Client(wire) as client:
            client.request(Ping())
    except (WireTimeout, RemoteError) as e:
        print(f"dart-jax: ping {args.link} ({wire.endpoint}): {e}", file=sys.stderr)
        return 1
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from dart_jax.capacity import plan
    return plan.main(_load_run_config(args), str(args.config), strict=args.strict)


def cmd_tpu(args: argparse.Namespace) -> int:
    from dart_jax.run.launchers import tpu
    cfg = _load_run_config(args)
    try:
        return tpu.main(args.action, cfg, str(args.config), config_lib.dump(cfg), dry_run=args.dry_run)
    except tpu.TPUCommandError as e:
        print(f"dart-jax: tpu {args.action}: {e}", file=sys.stderr)
        return 1


def cmd_export_hf(args: argparse.Namespace) -> int:
    import json
    from dart_jax.run import policy_dirs
    print(json.dumps(policy_dirs.export_hf(args.checkpoint_dir, args.out_dir, args.config, args.step, args.dtype)))
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    import json
    from dart_jax.run import policy_dirs
    print(json.dumps(policy_dirs.import_hf(args.hf_dir, args.run_dir)))
    return 0


def _add_ping(sub) -> None:
    ping = sub.add_parser("ping", help="ask a server of the run's config whether it answers (liveness probes)")
    ping.add_argument("config", type=Path, help="a YAML file in configs/")
    ping.add_argument("link", choices=("data.wire", "envs.wire"), help="the link whose server is asked")
    ping.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides (the endpoint to ask at)")
    ping.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer")
    ping.set_defaults(fn=cmd_ping)


def _add_scale_commands(sub) -> None:
    """plan (dart_jax.capacity), tpu (dart_jax.run.launchers), export-hf, import-hf (dart_jax.run.policy_dirs)."""
    plan = _with_config(sub.add_parser("plan", help="per-chip memory estimate of the run's trainer"))
    plan.add_argument("--strict", action="store_true", help="exit 1 when the plan warns (does not fit)")
    plan.set_defaults(fn=cmd_plan)
    tpu = sub.add_parser("tpu", help="the trainer on a Cloud TPU slice (gcloud)").add_subparsers(dest="action",
                                                                                               required=True)
    for action, text in (("submit", "create the slice, install, launch the trainer on every host, follow"),
                         ("status", "the queued resource's state and what submit would do"),
                         ("logs", "follow worker 0's trainer log"), ("stop", "stop the trainer on every host"),
                         ("delete", "delete the slice and its queued resource")):
        p = _with_config(tpu.add_parser(action, help=text))
        p.add_argument("--dry-run", action="store_true", help="print the gcloud commands in order, run nothing")
        p.set_defaults(fn=cmd_tpu)
    export = sub.add_parser("export-hf", help="a trainer checkpoint -> a Hugging Face directory")
    export.add_argument("checkpoint_dir", type=Path, help="the run's checkpoints/ directory")
    export.add_argument("out_dir", type=Path, help="a new (or empty) directory")
    export.add_argument("--config", type=Path, help="the run config (default: CHECKPOINT_DIR/../config.yaml)")
    export.add_argument("--step", type=int, help="the checkpoint step (default: the latest)")
    export.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="tensor dtype (default: the policy checkpoint's)")
    export.set_defaults(fn=cmd_export_hf)
    imp = sub.add_parser("import-hf", help="check a Hugging Face directory and start a run from it")
    imp.add_argument("hf_dir", type=Path)
    imp.add_argument("run_dir", type=Path, help="the run directory (its config.yaml gets policy.hf_dir)")
    imp.set_defaults(fn=cmd_import_hf)


def _with_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("config", type=Path, help="a YAML file in configs/")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides, e.g. trainer.optimizer.lr=1e-6")
    return parser


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (`dart-jax: ...`, exit 2), as every command's are."""

    def error(self, message: str):
        self.exit(2, f"dart-jax: {self.prog.removeprefix('dart-jax').strip() or 'usage'}: {message} "
                     f"(see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dart-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cfg = sub.add_parser("config", help="inspect configs").add_subparsers(dest="action", required=True)
    _with_config(cfg.add_parser("show", help="print the resolved run config")).set_defaults(fn=cmd_config_show)
    _with_config(sub.add_parser("env-server", help="serve GUI env slots (MiniWoB++, OSWorld, synthetic)")
                 ).set_defaults(fn=cmd_env_server)
    _with_config(sub.add_parser("data-manager", help="serve the trajectory store, scheduling and curated batches")
                 ).set_defaults(fn=cmd_data_manager)
    _with_config(sub.add_parser("rollout", help="a rollout worker: vLLM engine, K episodes at once, weight sync")
                 ).set_defaults(fn=cmd_rollout)
    _with_config(sub.add_parser("train", help="the trainer: SFT on trajectory files or RL on curated batches")
                 ).set_defaults(fn=cmd_train)
    _with_config(sub.add_parser("run", help="a whole run: every role its own process, phase after phase")
                 ).set_defaults(fn=cmd_run)
    ev = _with_config(sub.add_parser("eval", help="held-out success of a policy (Wilson intervals)"))
    ev.add_argument("--policy", type=Path, help="a Hugging Face directory or a checkpoints/ directory "
                                                "(default: the config's policy)")
    ev.add_argument("--label", default="eval", help="names the result: runs/<name>/eval/LABEL.json")
    ev.set_defaults(fn=cmd_eval)
    keys = sub.add_parser("keys", help="generate a CURVE key pair for authenticated links")
    keys.add_argument("directory", type=Path)
    keys.add_argument("name")
    keys.set_defaults(fn=cmd_keys)
    _add_scale_commands(sub)
    _add_ping(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except config_lib.ConfigError as e:
        print(f"dart-jax: config error: {e}", file=sys.stderr)
        return 2
    except config_lib.UsageError as e:  # a bad path, id or value the user gave: one line
        print(f"dart-jax: {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
