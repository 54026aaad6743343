"""`specdiff export`."""

from __future__ import annotations

import click

from .flags import check_pair


@click.command()
@click.option("--target", help="Target model: models.yaml name, directory or hub id.")
@click.option("--drafter", help="Diffusion drafter: models.yaml name, directory or hub id.")
@click.option("--pair", callback=check_pair, help="A models.yaml pair: export its target and drafter.")
@click.option("--format", "fmt", type=click.Choice(["onnx", "tensorrt", "all"]), default="onnx",
              show_default=True, help="onnx: graphs; tensorrt: engines only (needs a GPU); all: both.")
@click.option("--out", required=True, metavar="DIR", help="New directory (written complete or not at all).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True,
              help="Dtype of the graphs; TensorRT 11 engines keep it (strongly typed).")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset (TensorRT: at most 20).")
@click.option("--max-batch", type=int, default=1, show_default=True, help="Largest batch (TensorRT profile).")
@click.option("--max-seq", type=int,
              help="Longest sequence, prompt + new tokens (TensorRT profile) [default: the context window "
                   "less one 64-token step].")
@click.option("--device", default="cpu", show_default=True, help="Where the models run while exporting.")
@click.option("--stored-blocks", is_flag=True,
              help="A GGUF target's Q4_0/Q4_1 matrices as ONNX Runtime MatMulNBits over the file's own blocks "
                   "(fp32 arithmetic; faster one-token steps, slower verifies: docs/export-onnx-tensorrt.md).")
def export(target: str | None, drafter: str | None, pair: str | None, fmt: str, out: str, dtype: str, opset: int,
           max_batch: int, max_seq: int | None, device: str, stored_blocks: bool) -> None:
    """Export a target and/or a diffusion drafter to ONNX (and TensorRT), validated against PyTorch.

    \b
    Examples:
      specdiff export --pair demo --out demo-onnx                 # offline, seconds
      specdiff generate --pair demo --runtime onnxruntime --artifacts demo-onnx --prompt "Hello"
      specdiff export --target gpt-neo-2.7B --dtype fp16 --format all --out neo-trt   # hub: network
    """
    from specdiff.exporters.export import export as run_export

    path = run_export(out, target=target, drafter=drafter, pair=pair, fmt=fmt, dtype=dtype, opset=opset,
                      max_batch=max_batch, max_seq=max_seq, device=device, stored_blocks=stored_blocks)
    click.echo(str(path))
