"""A/B in one process: the public call (``entropy_loss_forward_backward``) of this checkout's kernels against the
public call of another commit's kernels, alternated round by round; do_bench median with L2 flushed, each checked
against float64 first (the loss over every row, the gradient on its first rows). Asks whether a kernel change is
faster through what users call, in one machine moment rather than across sessions.

  git archive BASE_COMMIT kernels | tar -x -C DIR     # the other commit's kernels, in an ignored folder
  python scripts/ab_code_trees.py --base DIR LOSS/FORMAT:TOKENSxVOCAB [...] [--rounds 5] [--variant fused]

The other tree is imported as the package ``kernels_base`` (its modules import each other relatively); it shares this
checkout's ``perfutils``, and its operators are renamed in DIR to the torch.library namespace
``fused_loss_kernels_base``. Each tree's first-call search keeps its own choices (the cache file is named by a stamp of
the kernels' sources: kernels.autotune.cache_file); give the process a fresh ``FUSED_LOSS_CACHE_DIR`` so that both
search in this moment. Each tree reads the tuning table beside its own package (``DIR/data/<gpu>/tuning.csv``): copy
it there too, else the base runs the heuristic's plan where the head runs the table's (the script stops on that).
"""
import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import triton

import kernels
from ab_public_plan import cell, compare


def import_tree(directory: str, name: str = "kernels_base"):
    """The ``kernels`` package under ``directory`` as the module ``name``."""
    package = Path(directory) / "kernels"
    if not (package / "__init__.py").is_file():
        raise SystemExit(f"{package} holds no kernels package (git archive COMMIT kernels | tar -x -C {directory})")
    # One torch.library per namespace: the other tree's operators get their own (its folder is a throwaway copy).
    ops = package / "ops.py"
    if ops.is_file():
        ops.write_text(ops.read_text().replace('NAMESPACE = "fused_loss"', f'NAMESPACE = "fused_loss_{name}"'))
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def check_tuning_tables(trees: dict, gpu_name: str) -> None:
    """Stop when one tree has a tuning table for this GPU and the other has none: table mode would compare plans."""
    found = {name: bool(importlib.import_module(f"{tree.__name__}.autotune").load_tuning_table(gpu_name))
             for name, tree in trees.items()}
    if len(set(found.values())) > 1:
        missing = [name for name, has in found.items() if not has]
        raise SystemExit(f"no tuning table for {gpu_name} beside the {missing[0]} tree's package (copy data/<gpu>/"
                         f"tuning.csv into {Path(trees[missing[0]].__file__).parent.parent}/data/<gpu>/)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", type=cell)
    parser.add_argument("--base", required=True, help="a folder holding the other commit's kernels/")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variant", default="auto", help="the public call's variant (default auto: the search's)")
    args = parser.parse_args()
    trees = {"head": kernels, "base": import_tree(args.base)}
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    check_tuning_tables(trees, torch.cuda.get_device_name())

    def make_calls(x, t, loss, fmt):
        return {name: (lambda tree=tree: tree.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt,
                                                                             variant=args.variant))
                for name, tree in trees.items()}

    def describe(name, x, t, loss, fmt):  # after the first call: the search's choice
        return trees[name].prepare(x, t, loss=loss, target_format=fmt, variant=args.variant).config

    compare(args.cells, make_calls, describe, args.rounds)


if __name__ == "__main__":
    main()
