"""The llm's queue-full byte (serving/queue_full.py): the admission says when its queue fills and empties, the byte
crosses processes, and the entry refuses only when every llm instance is full. The served path is tested in
tests/reliability/test_rel_overload.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cpu_engine.admission import Admission, QueueFullError
from serving.queue_full import MAX_INSTANCES, QueueFullFlag, create_queue_full_file, instance_index
from serving.triton_install import PROJECT_ROOT


def test_the_admission_says_when_its_queue_fills_and_when_it_has_room_again():
    told: list[bool] = []
    admission = Admission(2, on_full=told.append)
    admission.admit()
    assert told == []
    admission.admit()
    assert told == [True]
    with pytest.raises(QueueFullError):
        admission.admit()
    admission.admit_probe()  # probes wait outside the bound: they neither fill it nor free it
    admission.left_queue(count=0, probes=1)
    assert told == [True]
    admission.left_queue(1)
    assert told == [True, False]
    admission.left_queue(1)
    admission.admit()
    assert told == [True, False]  # told on each change, not on each request
    admission.admit()
    assert told == [True, False, True]


def test_the_byte_one_process_publishes_is_what_another_reads(tmp_path):
    path = tmp_path / "queue-full"
    create_queue_full_file(path)
    reader = QueueFullFlag(str(path))
    assert reader.shared and not reader.all_full(1)
    publish = ("from serving.queue_full import QueueFullFlag; import sys; "
               "QueueFullFlag(sys.argv[1]).publish(int(sys.argv[2]), sys.argv[3] == 'full')")

    def llm_instance(index: int, state: str) -> None:
        subprocess.run([sys.executable, "-c", publish, str(path), str(index), state], cwd=PROJECT_ROOT, check=True)

    llm_instance(0, "full")
    assert reader.all_full(1)
    assert not reader.all_full(2)  # a second instance still has room: the llm gets the request
    llm_instance(1, "full")
    assert reader.all_full(2)
    llm_instance(0, "room")
    assert not reader.all_full(2) and not reader.all_full(1)


def test_without_the_launchers_file_nothing_is_refused_at_the_entry(monkeypatch):
    monkeypatch.delenv("TRITON_LLM_QUEUE_FULL_FILE", raising=False)
    flag = QueueFullFlag()
    flag.publish(0, True)
    assert not flag.shared and not flag.all_full(1)


def test_instance_names_give_their_byte_and_the_rest_none():
    assert instance_index("llm_0_0") == 0 and instance_index("my_llm_1_3") == 3
    assert instance_index(f"llm_0_{MAX_INSTANCES}") is None and instance_index("llm") is None


def test_a_missing_file_turns_the_entry_refusal_off_and_says_why(tmp_path):
    flag = QueueFullFlag(str(tmp_path / "gone"))
    flag.publish(0, True)
    assert not flag.shared and not flag.all_full(1) and "the llm alone refuses" in flag.problem
