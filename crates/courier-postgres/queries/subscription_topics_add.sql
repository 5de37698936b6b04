-- Adds topic patterns to a subscription; existing patterns are kept as they are;
-- returns the patterns added. $2 patterns, $3 prefixes (NULL for an exact
-- topic, '' for `*`). Touches: subscription_topics. Runs under the fan-out lock.
INSERT INTO {schema}.subscription_topics (subscription, pattern, prefix)
SELECT $1, p.pattern, p.prefix FROM unnest($2::text[], $3::text[]) AS p (pattern, prefix)
ON CONFLICT (subscription, pattern) DO NOTHING
RETURNING pattern
