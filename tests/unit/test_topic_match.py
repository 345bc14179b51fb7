"""The transport's topic matching, which every received message goes through, against paho's reference."""

import paho.mqtt.client as mqtt
import pytest

from edgesdk.fleet.transport import _levels, _matches

FILTERS = ["edgesdk/devices/+/state", "$share/servers/edgesdk/devices/+/events", "edgesdk/devices/+/need",
           "edgesdk/#", "edgesdk/servers/+", "edgesdk/devices/cam0/chunks/#", "a/b", "+/+", "#"]
TOPICS = ["edgesdk/devices/cam0/state", "edgesdk/devices/cam0/events", "edgesdk/devices/cam0/need",
          "edgesdk/devices/cam0/state/extra", "edgesdk/servers/r0", "edgesdk", "edgesdk/devices/cam0/chunks/t1/3",
          "edgesdk/devices/cam0/chunks", "a/b", "a/b/c", "a", "edgesdk/devices//state"]


@pytest.mark.parametrize("topic_filter", FILTERS)
def test_matching_agrees_with_paho(topic_filter: str) -> None:
    reference = topic_filter.split("/", 2)[2] if topic_filter.startswith("$share/") else topic_filter
    for topic in TOPICS:
        assert _matches(_levels(topic_filter), topic.split("/")) == mqtt.topic_matches_sub(reference, topic), \
            (topic_filter, topic)
