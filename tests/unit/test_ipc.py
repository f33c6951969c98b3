import msgpack
import pytest

from shared.channels import inventory_protocol
from shared.node.device_record import is_valid_device_id
from shared.node.driver_status import StatusReading
from tests.support.inventory import message, record


def test_round_trip_keeps_every_field():
    original = message(devices=(record(), record("rbln0-1", npu="7", numa_node=None, parent_pf="0000:03:00.0",
                                                 pci_path=None, status=StatusReading(None))),
                       discovery_error=None, cdi_resolvable=True)
    assert inventory_protocol.decode(inventory_protocol.encode(original)) == original


def _raw(**overrides):
    raw = msgpack.unpackb(inventory_protocol.encode(message()))
    raw.update(overrides)
    return msgpack.packb(raw)


@pytest.mark.parametrize("payload,fragment", [
    (b"\xc1junk", "not msgpack"),
    (msgpack.packb([1, 2]), "message has type list"),
    (_raw(v=inventory_protocol.SCHEMA_VERSION + 1), "schema version"),
    (_raw(cdi=None), "cdi has type NoneType"),
    (_raw(cdi=1), "cdi has type int"),
    (_raw(resource="nvidia.com/gpu"), "unknown resource"),
    (_raw(seq=0), "not positive"),
    (_raw(seq="1"), "seq has type str"),
    (_raw(devices=[{"id": "../etc"}]), "not valid"),
    (_raw(devices="x"), "devices has type str"),
    (b"\x00" * (inventory_protocol.MAX_MESSAGE_BYTES + 1), "exceeds"),
])
def test_malformed_messages_are_rejected_with_a_reason(payload, fragment):
    with pytest.raises(inventory_protocol.ProtocolError) as caught:
        inventory_protocol.decode(payload)
    assert fragment in str(caught.value)


def test_duplicate_device_ids_are_rejected():
    with pytest.raises(inventory_protocol.ProtocolError, match="twice"):
        inventory_protocol.decode(inventory_protocol.encode(message(devices=(record(), record()))))


@pytest.mark.parametrize("device_id,valid", [
    ("rbln0", True), ("rbln0-1", True), ("a" * 63, True), ("rbln0\n", False), ("a" * 64, False),
    (".", False), ("..", False), ("-rbln0", False), ("rbln/0", False), ("", False),
])
def test_device_ids_are_checked_in_full(device_id, valid):
    assert is_valid_device_id(device_id) is valid
