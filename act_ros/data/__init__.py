"""Dataset writers: LeRobot v3 datasets with the features of the I/O contract.

- :mod:`act_ros.data.episode`: an episode as arrays, and the dataset layout (features).
- :mod:`act_ros.data.writer`: atomic writing (staging directory, rename when complete).
- :mod:`act_ros.data.video_backend`: the video decoder every dataset is opened with.
- :mod:`act_ros.data.synthetic`: ``act-ros generate-synthetic`` (smoke-test data).
- :mod:`act_ros.data.collect`: scripted-expert demonstrations in the simulation (the
  command ``act-ros collect`` is :mod:`act_ros.training.drivers.collect`, which adds DAgger), with
  :mod:`act_ros.data.rollout` running the episodes (also in worker processes).

Nothing here imports rclpy; torch and LeRobot load only when a dataset is written.
"""
