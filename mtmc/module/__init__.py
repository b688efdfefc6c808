"""An uploaded module: capture (torch.fx on fake tensors, in a sandboxed child), the split into
fusion groups the catalog serves, and the assembly of ModelNew."""
