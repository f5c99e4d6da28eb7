"""Symmetric-memory smoke on N local GPUs: rendezvous, peer pointers, a P2P write through a peer view."""
import torch
import torch.distributed as dist
from glm5_fastpath.moe.ep.launch import run_ranks


def main(rank, world):
    import torch.distributed._symmetric_memory as symm_mem
    dev = torch.device("cuda", rank)
    buf = symm_mem.empty(1 << 20, dtype=torch.uint8, device=dev)
    try:
        h = symm_mem.rendezvous(buf, dist.group.WORLD)
    except TypeError:
        h = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
    buf.zero_()
    dist.barrier()
    torch.cuda.synchronize()
    ptrs = list(h.buffer_ptrs)
    peer = (rank + 1) % world
    view = h.get_buffer(peer, (256,), torch.int32)
    view.fill_(100 + rank)  # a kernel on my GPU storing into the peer's memory
    torch.cuda.synchronize()
    dist.barrier()
    mine = buf[:1024].view(torch.int32)
    ok = bool((mine == 100 + (rank - 1) % world).all())
    can = [torch.cuda.can_device_access_peer(rank, r) for r in range(world) if r != rank]
    return {"rank": rank, "ptrs": [hex(p) for p in ptrs], "own_ptr": hex(buf.data_ptr()), "p2p_write_ok": ok,
            "can_access_peer": can, "torch": torch.__version__}


if __name__ == "__main__":
    n = torch.cuda.device_count()
    for r in run_ranks(main, n, backend="nccl"):
        print(r)
