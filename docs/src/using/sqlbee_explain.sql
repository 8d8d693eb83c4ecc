CREATE PROCEDURE APP_SCHEMA.sqlbee_explain(IN statement LONGTEXT)
    SQL SECURITY DEFINER
    COMMENT 'sqlbee: EXPLAIN FORMAT=JSON of one statement, never the statement itself'
BEGIN
    SET @sqlbee_explain = CONCAT('EXPLAIN FORMAT=JSON ', statement);
    PREPARE sqlbee_explain_statement FROM @sqlbee_explain;
    EXECUTE sqlbee_explain_statement;
    DEALLOCATE PREPARE sqlbee_explain_statement;
END
