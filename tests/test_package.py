import beam_ext


def test_version_is_set():
    assert beam_ext.__version__.count(".") == 2
