"""Film ids: stable for a folder, keyed by the folder's own secret, never the file name."""

from __future__ import annotations

import stat

from medgemma_xray.assistant.batch.films import KEY_NAME, film_key, find_films


def test_ids_are_stable_per_output_folder_and_differ_between_folders(tmp_path):
    films = tmp_path / "films"
    (films / "ward").mkdir(parents=True)
    for name in ("Smith_John.dcm", "ward/b.png", ".hidden.png"):
        (films / name).write_bytes(b"x")
    (films / ".cache").mkdir()
    (films / ".cache" / "c.png").write_bytes(b"x")
    first, second = tmp_path / "out1", tmp_path / "out2"
    first.mkdir(), second.mkdir()
    key = film_key(first)
    assert film_key(first) == key and stat.S_IMODE((first / KEY_NAME).stat().st_mode) == 0o600
    assert list(first.iterdir()) == [first / KEY_NAME]  # no temporary file left behind
    found = find_films(films, key)
    assert [f.relative for f in found] == ["Smith_John.dcm", "ward/b.png"]  # hidden files and folders skipped
    assert [f.film_id for f in find_films(films, film_key(first))] == [f.film_id for f in found]
    assert not {f.film_id for f in found} & {f.film_id for f in find_films(films, film_key(second))}
    assert all(len(f.film_id) == 20 and "Smith" not in f.film_id for f in found)


def test_an_output_folder_inside_the_input_is_not_read_as_films(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.csv").write_text("x")
    found = find_films(tmp_path, film_key(tmp_path / "results"), exclude=tmp_path / "results")
    assert [f.relative for f in found] == ["a.png"]
