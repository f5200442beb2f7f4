"""A console's launch of a fine-tuning job that sets every field of the launch's
container, typed: base-model weights from the node's volume store, scratch space, a
disk bound, a sandbox. It passes ``mypy --strict`` (tests/unit/test_docs_examples.py
runs it over this file, and fails when `Container` has a field this launch does not set).

Run: ``python every_field.py http://127.0.0.1:8470 <token>``.
"""

from __future__ import annotations

import sys

from tuneplane_node.client import (
    Container,
    Launched,
    Mount,
    NodeClient,
    RunConflict,
    Scratch,
    Volume,
)

BASE_SHA256 = "4f1c" * 16  # the weights' sha256: a URL volume names the bytes it must be


def spec(run_id: str, registry_password: str) -> Container:
    return Container(
        image="registry.example/trainer:1.4",
        name=f"ft-{run_id}",
        command=["python", "-m", "trainer", "--resume", "/ckpt/last"],
        env={"HF_HUB_OFFLINE": "1", "STEPS": "4000"},
        mounts=[Mount("/srv/tuneplane/ckpt", "/ckpt")],
        labels={"tuneplane.user": "ada", "tuneplane.kind": "sft"},
        workdir="/work",
        shm_size="16g",
        cpu_limit=8,
        memory_limit="64g",
        disk_limit="50g",
        inode_limit=500_000,
        network="bridge",
        user="1000:1000",
        stop_signal="SIGUSR1",
        warn_signal="SIGUSR2",
        warn_s=120,
        isolation="sandbox",
        rdma=False,
        read_only_root=True,
        scratch=Scratch("/scratch", "200g"),
        volumes=[
            Volume("https://models.example/base-7b.safetensors", "/models/base", BASE_SHA256),
            Volume("registry.example/tokenizers:7b", "/models/tokenizer"),
        ],
        pull_policy="if_not_present",
        registry_auth={"username": "ada", "password": registry_password},
    )


def launch(url: str, token: str, run_id: str = "every-field") -> Launched | None:
    with NodeClient(url, token=token) as node:
        try:
            return node.launch(run_id, spec(run_id, "secret"), requested_gpus=1, relaunch=True)
        except RunConflict as conflict:
            print(f"{run_id} runs with another spec: {conflict.detail}")
            return None


if __name__ == "__main__":
    launched = launch(sys.argv[1], sys.argv[2])
    print("refused" if launched is None else f"{launched.ref}: {launched.phase}")
