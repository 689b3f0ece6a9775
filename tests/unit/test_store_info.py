"""``DescribeStore``'s answer as the client reads it (bulldozer.kv.convert)."""

from __future__ import annotations

from bulldozer.kv.convert import store_info, store_info_from
from bulldozer.kv.types import BaseCopy, StoreInfo
from bulldozer.kv.v1 import kv_pb2


def test_every_kind_of_base_copy_travels_both_ways() -> None:
    for copy in BaseCopy:
        for info in (StoreInfo("some-engine", copy), StoreInfo("some-engine", copy, 511, 4 * 1024 * 1024)):
            assert store_info_from(kv_pb2.StoreInfo.FromString(store_info(info).SerializeToString())) == info


def test_an_answer_naming_no_copy_this_client_knows_is_no_answer() -> None:
    assert store_info_from(kv_pb2.StoreInfo(engine="redis")) is None  # unspecified
    assert store_info_from(kv_pb2.StoreInfo(engine="redis", base_copy=99)) is None  # a newer DAL's kind
