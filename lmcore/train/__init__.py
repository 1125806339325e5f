"""Training: the runner behind `lmcore train` (`trainer`), its options and schedule (`config`),
a training checkpoint (`state`), run directories (`runs`), more than one process (`parallel`),
sweeps and comparisons (`sweep`), loss curves (`plots`), experiment trackers (`trackers`), the
random-token smoke run of `lmcore run` (`smoke`) and `lmcore quickstart` (`quickstart`).

    from lmcore.train.trainer import TrainConfig, resume, train
"""
