from billing import apply_discount, split, total


def test_total_of_whole_amounts():
    assert total([1.0, 2.0, 3.0]) == 6.0


def test_total_in_cents():
    assert total([0.1, 0.2]) == 0.3


def test_discount_rounds_half_up_to_the_cent():
    assert apply_discount(10.05, 50) == 5.03


def test_discount_of_nothing():
    assert apply_discount(0, 20) == 0


def test_split_adds_up_exactly():
    assert split(100.00, 3) == [33.34, 33.33, 33.33]


def test_split_into_one():
    assert split(12.5, 1) == [12.5]
