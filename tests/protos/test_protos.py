"""The wire contract: committed stubs match the .proto, and the proto follows the house rules."""

from pathlib import Path

from google.protobuf import descriptor

from rcswarm.protos import generate
from rcswarm.protos.v1 import coordinator_pb2 as pb


def test_committed_stubs_equal_a_fresh_generation(tmp_path):
    for path in generate.generate(tmp_path):
        committed = generate.PROTO_DIR / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is stale: run `python -m rcswarm.protos.generate` and commit the result"
        )


def test_package_and_enums():
    assert pb.DESCRIPTOR.package == "rcswarm.v1"
    for enum in pb.DESCRIPTOR.enum_types_by_name.values():
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.name}'s zero value is {zero}"


def test_one_request_and_response_per_rpc():
    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    expected = {"Join", "Heartbeat", "Leave", "PullParameters", "PushUpdate", "ReportMetrics", "GetStatus"}
    assert expected <= set(service.methods_by_name)
    inputs = [m.input_type.name for m in service.methods]
    outputs = [m.output_type.name for m in service.methods]
    for method in service.methods:
        assert method.input_type.name == f"{method.name}Request"
        assert method.output_type.name == f"{method.name}Response"
    assert len(set(inputs)) == len(inputs) and len(set(outputs)) == len(outputs)
    assert service.methods_by_name["PullParameters"].server_streaming
    assert service.methods_by_name["PushUpdate"].client_streaming


def test_the_proto_ships_beside_its_stubs():
    assert (Path(pb.__file__).parent / "coordinator.proto").exists()
    assert isinstance(pb.DESCRIPTOR, descriptor.FileDescriptor)
