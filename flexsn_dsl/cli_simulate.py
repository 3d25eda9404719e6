"""The ``flexsn-dsl simulate`` command: a neuron on a driving input (the spec's ``simulate:`` defaults
unless given), its spike counts, rates and final states, plots, CSV, and a hint when nothing spiked."""
from __future__ import annotations

import os

from .console import (UsageError, at_least, check_size_names, compile_with_options, parse_params, parse_sizes,
                      refuse_overwriting_inputs, table)
from .errors import SpecError, printable


def _drive(item: str, names: list[str]) -> tuple[str, object]:
    """``[NAME=]VALUE`` or ``[NAME=]FILE.npy`` -> (input name, number or array)."""
    import numpy as np
    name, sep, value = item.partition("=")
    if not sep or not name.strip().isidentifier():
        name, value = names[0], item
    name = name.strip()
    if name not in names:
        raise SpecError(f"--input {item!r}: the neuron has no input {name!r}", hint=f"its inputs are {names}")
    try:
        drive = float(value)
    except ValueError:
        if not value.endswith(".npy"):
            raise SpecError(f"--input {item!r} is not a number or a .npy file",
                            hint="e.g. --input 1.5, --input x=1.5 or --input drive.npy (shape [T] or [T, N])") from None
        try:
            drive = np.load(value, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SpecError(f"--input {item!r}: cannot read {printable(value)}: {exc}",
                            hint="give a .npy file written by numpy.save, of shape [T] or [T, N]") from None
    if np.asarray(drive).dtype.kind not in "biuf" or not np.isfinite(drive).all():
        raise SpecError(f"--input {item!r} holds a value that is not a finite real number", hint="give finite numbers")
    return name, drive


def cmd_simulate(args) -> int:
    """Run a spec on a driving input; print spike counts, rates and final states; plot or write CSV."""
    from . import simulation as sim_module
    from .runtime import load
    at_least("--steps", args.steps, 1)
    at_least("--neurons", args.neurons, 1)
    at_least("--seed", args.seed, 0)
    if args.seed is not None and args.seed >= 2 ** 63:
        raise UsageError(f"--seed {args.seed}: give a whole number below 2**63")
    arrays = [item.partition("=")[2] or item for item in args.input if item.endswith(".npy")]
    refuse_overwriting_inputs({"--csv": args.csv, "--plot": args.plot}, [args.spec, *arrays, *args.plugin])
    sizes = parse_sizes(args.size)
    model = compile_with_options(args.spec, args).model  # the model load makes, for its `simulate:` defaults
    check_size_names(sizes, [model])
    defaults = model.simulate
    module = load(args.spec, params=parse_params(args.param), sizes={**defaults.sizes, **sizes}, backend="torch",
                  plugins=args.plugin, passes=args.passes)
    names = module.spec.inputs
    seed = args.seed
    if seed is None and module._compiled.model.draws:
        seed = int.from_bytes(os.urandom(4), "little")
        print(f"{module.spec.name} draws random numbers: seed {seed} (repeat the run with --seed {seed})")
    try:
        if args.fi:
            if args.input:
                raise ValueError("--fi sweeps constant inputs itself: leave out --input")
            steps = args.steps or defaults.steps or sim_module.DEFAULT_STEPS
            levels, rates = sim_module.fi_curve(module, sim_module.parse_sweep(args.fi), steps=steps, seed=seed)
            print(f"{module.spec.name}: f-I curve over {steps} steps from reset states (input {names[0]})")
            print(table([[f"{c:g}", f"{r:.4f}"] for c, r in zip(levels.tolist(), rates.tolist())],
                         [names[0], "rate (spikes/step)"]))
            if not rates.any():
                print(f"hint: no spike at any of these inputs over {steps} steps: sweep stronger ones (--fi LO:HI:K) "
                      "or run more steps (--steps T)")
            if args.csv:
                with open(args.csv, "w", encoding="utf-8") as f:
                    f.write(f"{names[0]},rate\n" + "".join(f"{c!r},{r!r}\n" for c, r in zip(levels.tolist(),
                                                                                       rates.tolist())))
            if args.plot:
                sim_module.plot_fi(module.spec.name, levels, rates, args.plot, names[0], steps)
        else:
            drives = dict(_drive(item, names) for item in args.input) or dict(defaults.drive) or {names[0]: 1.0}
            sim = sim_module.simulate(module, drives, steps=args.steps, neurons=args.neurons, seed=seed)
            _print_simulation(sim, drives)
            if sim.spikes is not None and not sim.spikes.any():
                print(_no_spike_hint(module, sim, drives, seed))
            if args.csv:
                sim.to_csv(args.csv)
            if args.plot:
                sim_module.plot_simulation(sim, args.plot)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    except OSError as exc:
        raise SpecError(f"cannot write {printable(exc.filename)}: {exc.strerror or exc}",
                        hint="give a path that can be written") \
            from None
    for what, path in (("rates" if args.fi else "traces", args.csv), ("plot", args.plot)):
        if path:
            print(f"{what} written to {printable(path)}")
    return 0


def _print_simulation(sim, drives: dict) -> None:
    described = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} from an array" for k, v in drives.items())
    print(f"{sim.neuron}: {sim.steps} steps, {sim.neurons} neuron(s), input {described}")
    if sim.spikes is None:
        print("no spike output (no output is bound to spike(...))")
    else:
        total = int(sim.spike_count.sum())
        print(f"spikes ({sim.spike_output}): {total}, rate {total / max(sim.steps * sim.neurons, 1):.4f} per step "
              "and neuron")
    shown = min(sim.neurons, 10)
    rows = []
    for n in range(shown):
        row = [str(n)]
        if sim.spikes is not None:
            row += [f"{int(sim.spike_count[n])}", f"{float(sim.rate[n]):.4f}"]
        row += [f"{float(v[-1, n]):.6g}" if sim.steps else "-" for v in sim.states.values()]
        rows.append(row)
    header = ["neuron"] + (["spikes", "rate"] if sim.spikes is not None else []) + \
        [f"{name} (final)" for name in sim.states]
    print(table(rows, header))
    if shown < sim.neurons:
        print(f"... and {sim.neurons - shown} more neurons")


def _no_spike_hint(module, sim, drives: dict, seed: int | None) -> str:
    """What to change when no neuron spiked: the drive (the first doubling of it that spikes, when one
    constant input is driven) or the steps."""
    from .simulation import SEARCH_DOUBLINGS, spiking_drive
    (name, level), = drives.items() if len(drives) == 1 else ((None, None),)
    if not isinstance(level, float):
        return f"hint: no spike over {sim.steps} steps: give a stronger drive (--input) or more steps (--steps T)"
    found = spiking_drive(module, name, level, sim.steps, seed)
    if found is None:
        return (f"hint: no spike at {name} = {level:g} over {sim.steps} steps, nor at up to {2 ** SEARCH_DOUBLINGS} "
                f"times that: give another drive (--input {name}=VALUE) or more steps (--steps T)")
    return f"hint: no spike at {name} = {level:g} over {sim.steps} steps: {name} = {found:g} spikes (--input " \
        f"{name}={found:g}), or give more steps (--steps T)"
