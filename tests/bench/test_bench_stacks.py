"""`bench stacks`: py-spy's raw stacks counted per thread and per function, own and inclusive."""

from radixserve.bench import stacks

LOOP = "thread (10): engine-loop;_run (services/scheduler/loop.py:150)"
RAW = "\n".join([
    f"{LOOP};_warm_up (services/scheduler/loop.py:320);step (engine/core.py:180) 50",
    f"{LOOP};_iterate (services/scheduler/loop.py:197);step (engine/core.py:180);"
    "upload_columns (engine/upload.py:71) 6",
    f"{LOOP};_iterate (services/scheduler/loop.py:197);step (engine/core.py:190);"
    "upload_columns (engine/upload.py:80) 2",
    f"{LOOP};_iterate (services/scheduler/loop.py:199);step (engine/core.py:181) 2",
    "thread (1): MainThread;run (asyncio/runners.py:118) 7",
    "not a stack line",
])


def test_functions_add_up_across_lines_and_only_under_the_chosen_frame() -> None:
    s = stacks.read(RAW.splitlines(), thread="engine-loop", under="_iterate")
    assert s.threads == {"thread (10): engine-loop": 60, "thread (1): MainThread": 7}
    assert s.samples == 10  # the warm-up's 50 and the other thread's 7 are left out
    # two lines of one function are one row; a caller's frames count inclusively once a stack
    assert s.own == {"upload_columns (engine/upload.py)": 8, "step (engine/core.py)": 2}
    assert s.inclusive["step (engine/core.py)"] == 10
    assert s.inclusive["_iterate (scheduler/loop.py)"] == 10
    report = stacks.format_report(s, top=5)
    assert "| upload_columns (engine/upload.py) | 8 | 80.0 % |" in report


def test_every_thread_without_a_filter_and_an_empty_selection_fails(tmp_path) -> None:
    s = stacks.read(RAW.splitlines())
    assert s.samples == 67 and s.own["run (asyncio/runners.py)"] == 7
    path = tmp_path / "raw.txt"
    path.write_text(RAW)
    assert stacks.main([str(path), "--thread", "engine-loop"]) == 0
    assert stacks.main([str(path), "--thread", "no-such-thread"]) == 1


def test_by_line_a_functions_lines_count_apart() -> None:
    s = stacks.read(RAW.splitlines(), thread="engine-loop", under="_iterate", by_line=True)
    assert s.own == {"upload_columns (engine/upload.py:71)": 6,
                     "upload_columns (engine/upload.py:80)": 2, "step (engine/core.py:181)": 2}
