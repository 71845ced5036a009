"""Inference: from a LeRobot checkpoint to an action for every control tick.

Checkpoint loading and Hub ids (``checkpoint``, ``checkpoint_info``, ``hub``), the network
and the predictor every backend shares (``network``, ``predictor``), the backends
(PyTorch, ONNX Runtime, OpenVINO: ``backends``, ``onnx_predictor``, ``export``), reduced
precision and its check (``precision``, ``quantized``), the child process it runs in
(``inference_process``, ``shared_frames``, ``latency_split``) and the policy runtime on
top (``runtime``) with its chunk queue and temporal ensembler (``chunking``) and the
real-time verdict (``feasibility``). ROS-free; imports only :mod:`act_ros.core`'s ground
floor (docs/architecture.md, section 1).
"""
