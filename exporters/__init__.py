"""Exporters: models -> graphs other runtimes execute (see runtimes/graphs.py for the contract).

    onnx.py       target step graph / drafter denoiser graph, checked against their spec
    validate.py   the exported graph against PyTorch on a sweep of shapes and cache histories
    tensorrt.py   TensorRT engines built from the ONNX graphs
    export.py     the whole `specdiff export`: models -> directory with manifest.json
"""
