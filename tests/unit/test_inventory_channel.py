"""The scanner's publisher and a worker's subscriber over real ZeroMQ ipc sockets."""

import os
import queue
import stat
import threading
import time

import pytest
import zmq

from scanner.publisher import InventoryPublisher
from shared.channels import inventory_protocol
from shared.channels.inventory_subscriber import InventorySubscriber, SyncState
from shared.resources import Resource
from tests.support.inventory import message, record
from tests.support.waiting import wait_until


@pytest.fixture
def channel(short_tmp):
    context = zmq.Context()
    publisher = InventoryPublisher(context, short_tmp)
    publisher.start()
    received: queue.Queue = queue.Queue()
    subscribers = []

    def subscribe(resource=Resource.NPU, timeout=5.0):
        subscriber = InventorySubscriber(context, short_tmp, resource, received.put, heartbeat_timeout=timeout)
        subscriber.start()
        subscribers.append(subscriber)
        return subscriber

    yield publisher, subscribe, received
    for subscriber in subscribers:
        subscriber.stop()
    publisher.stop()
    context.term()


def test_late_subscriber_gets_the_snapshot_then_only_newer_updates(channel, short_tmp):
    publisher, subscribe, received = channel
    publisher.publish(message(seq=1))
    publisher.publish(message(seq=2, devices=(record(), record("rbln1", bus_id="0000:04:00.0"))))
    # publish() only queues: the subscriber comes late once the publisher serves seq 2 itself.
    await_snapshot_seq(short_tmp, Resource.NPU, 2)
    subscribe()
    snapshot = received.get(timeout=5)
    assert snapshot.seq == 2 and [d.device_id for d in snapshot.devices] == ["rbln0", "rbln1"]
    assert publish_until_received(publisher, received, message(seq=3, devices=())).devices == ()


def test_snapshot_request_before_the_first_scan_is_answered_by_it(channel):
    publisher, subscribe, received = channel
    subscribe(Resource.NPU_VF4)
    publisher.publish(message(seq=1, resource=Resource.NPU))  # another resource's topic
    publisher.publish(message(seq=1, resource=Resource.NPU_VF4, devices=()))
    got = received.get(timeout=5)
    assert got.resource is Resource.NPU_VF4 and got.devices == ()


def await_snapshot_seq(run_dir, resource, seq, timeout=5.0):
    """Ask the publisher's snapshot socket, as a worker does, until its snapshot has sequence `seq`."""
    _, snapshot_endpoint = inventory_protocol.endpoints(run_dir)
    deadline = time.monotonic() + timeout
    with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
        dealer.linger = 0
        dealer.connect(snapshot_endpoint)
        while time.monotonic() < deadline:
            dealer.send_multipart([inventory_protocol.SNAPSHOT_REQUEST, inventory_protocol.topic(resource)])
            if dealer.poll(int(timeout * 1000)) and inventory_protocol.decode(dealer.recv_multipart()[-1]).seq == seq:
                return
    raise AssertionError(f"the publisher never served seq {seq}")


def publish_until_received(publisher, received, sent):
    """Republish `sent` until it arrives: the SUB socket's subscription reaches the publisher
    asynchronously (ZeroMQ's slow joiner), and duplicates are dropped by sequence number."""
    for _ in range(100):
        publisher.publish(sent)
        try:
            return received.get(timeout=0.05)
        except queue.Empty:
            continue
    raise AssertionError("the update never arrived")


def test_gap_and_epoch_change_trigger_a_resync(channel):
    publisher, subscribe, received = channel
    publisher.publish(message(seq=1))
    subscriber = subscribe()
    assert received.get(timeout=5).seq == 1
    assert publish_until_received(publisher, received, message(seq=2)).seq == 2
    publisher.publish(message(seq=5))  # a gap: the subscriber resyncs from the snapshot, which is seq 5
    assert received.get(timeout=5).seq == 5
    got = publish_until_received(publisher, received, message(seq=1, epoch="e2"))  # the scanner restarted
    assert (got.epoch, got.seq) == ("e2", 1)
    assert subscriber.state is not SyncState.INITIAL


def test_missed_heartbeat_resyncs_and_keeps_going(channel):
    publisher, subscribe, received = channel
    publisher.publish(message(seq=1))
    subscribe(timeout=0.3)
    assert received.get(timeout=5).seq == 1
    # No update for longer than the heartbeat timeout: the subscriber re-requests the snapshot.
    assert received.get(timeout=5).seq == 1


def voluntary_switches(thread: threading.Thread) -> int:
    with open(f"/proc/self/task/{thread.native_id}/status") as status:
        return int(next(line for line in status if line.startswith("voluntary_ctxt_switches:")).split()[1])


def test_stop_ends_a_subscriber_asleep_in_a_long_heartbeat_wait(channel, short_tmp):
    """It waits in one poll (no periodic wake-ups), which the stop pipe interrupts."""
    publisher, subscribe, received = channel
    publisher.publish(message(seq=1))
    subscriber = subscribe(timeout=3600)
    assert received.get(timeout=5).seq == 1
    (thread,) = [thread for thread in threading.enumerate() if thread.name == "inventory-subscriber"]
    before = voluntary_switches(thread)
    time.sleep(1.0)  # idle on purpose: what is measured is that nothing happens
    assert voluntary_switches(thread) - before <= 1, "the subscriber woke up with nothing to do"
    subscriber.stop()
    assert "inventory-subscriber" not in [thread.name for thread in threading.enumerate()]
    never_started = InventorySubscriber(zmq.Context.instance(), short_tmp, Resource.NPU, received.put,
                                        heartbeat_timeout=1)
    never_started.stop()  # nothing to end


def test_malformed_updates_are_ignored_and_the_last_good_state_kept(channel):
    publisher, subscribe, received = channel
    publisher.publish(message(seq=1))
    subscribe()
    assert received.get(timeout=5).seq == 1
    assert publish_until_received(publisher, received, message(seq=2)).seq == 2
    publisher._pipe.send_multipart([inventory_protocol.topic(Resource.NPU), b"\xc1 not msgpack"])
    publisher.publish(message(seq=3, devices=()))
    got = received.get(timeout=5)
    assert got.seq == 3 and received.empty()


def test_junk_snapshot_requests_do_not_stop_the_publisher(channel, short_tmp):
    publisher, subscribe, received = channel
    rogue = zmq.Context.instance().socket(zmq.DEALER)
    rogue.connect(inventory_protocol.endpoints(short_tmp)[1])
    rogue.send_multipart([b"junk"])
    rogue.send_multipart([inventory_protocol.SNAPSHOT_REQUEST, b"nvidia.com/gpu"])
    rogue.send_multipart([b"x" * 10_000])
    publisher.publish(message(seq=1))
    subscribe()
    assert received.get(timeout=5).seq == 1
    rogue.close(linger=0)


def test_ipc_sockets_are_owner_only(channel, short_tmp):
    for endpoint in inventory_protocol.endpoints(short_tmp):
        mode = stat.S_IMODE(os.stat(endpoint.removeprefix("ipc://")).st_mode)
        assert mode == 0o600


def test_a_deleted_socket_file_is_bound_again_at_the_next_publication(short_tmp, monkeypatch):
    # No periodic check within the test: only the publication can bring the file back.
    monkeypatch.setattr("scanner.publisher._FILE_CHECK_SECONDS", 3600.0)
    context = zmq.Context()
    publisher = InventoryPublisher(context, short_tmp)
    publisher.start()
    try:
        paths = [endpoint.removeprefix("ipc://") for endpoint in inventory_protocol.endpoints(short_tmp)]
        for path in paths:
            os.unlink(path)
        publisher.publish(message(seq=1))
        wait_until(lambda: all(os.path.exists(path) for path in paths), 10, "the socket files bound again")
        assert all(stat.S_ISSOCK(os.stat(path).st_mode) for path in paths)
    finally:
        publisher.stop()
        context.term()
