"""Classifier head in fp16: Linear -> Tanh -> Linear -> log_softmax."""
import torch
import torch.nn as nn

batch_size, features, hidden, classes = 16, 64, 32, 10


class Model(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, classes))
        self.half()

    def forward(self, x):
        return torch.log_softmax(self.net(x), dim=-1)


def get_inputs():
    return [torch.randn(batch_size, features, dtype=torch.float16)]


def get_init_inputs():
    return [features, hidden, classes]
