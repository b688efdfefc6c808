"""KL divergence of the log of predicted probabilities, batch mean, as KernelBench writes it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.kl_div(torch.log(predictions), targets, reduction='batchmean')


batch_size = 16
input_shape = (300,)


def get_inputs():
    return [torch.rand(batch_size, *input_shape).softmax(dim=-1), torch.rand(batch_size, *input_shape).softmax(dim=-1)]


def get_init_inputs():
    return []
