"""Exporters: models -> graphs other runtimes execute (specdiff/graphs.py is the contract,
specdiff/artifacts.py the directory format).

    onnx.py       target step graph / drafter denoiser graph, checked against their spec
    drafters.py   EXPORTERS: per drafter graph a kind declares (specdiff.kinds), how it is written
    validate.py   the exported graph against PyTorch on a sweep of shapes and cache histories
    tensorrt.py   TensorRT engines built from the ONNX graphs
    export.py     the whole `specdiff export`: models -> directory with manifest.json
    manifest.py   what a manifest records beyond the graphs: source models, tool versions
    cache.py      exports made on demand into the user cache (`--runtime onnxruntime`, no `--artifacts`)

May import: the rest of specdiff (models, graphs and artifacts formats), which never imports this
package, and, for validation only, specdiff.runtimes' ONNX Runtime; not the tools or specdiff_cli.
"""
