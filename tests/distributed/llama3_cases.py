"""What the llama3 tests that compare one rank's slice of the packed stream share."""
from helpers import distributed_cases as dc
import torch


def compare_slice(got, singles, single_lse, wants, rank, n):
    """Rank `rank`'s out, LSE and gradients (rows rank n .. (rank + 1) n of the stream, in
    float32) against one process's and the references', the LSE's truth being one process's
    float32 LSE (no float64 reference computes it): distributed_cases' result dict."""
    singles.insert(1, single_lse)
    for want in wants.values():
        want.insert(1, single_lse)
    return dc.compare(got, singles, wants, torch.float32, lambda t: t[rank * n:(rank + 1) * n],
                      False, check_dtypes=True, lse_cut=lambda t: t[:, rank * n:(rank + 1) * n])
